"""The export formats by name (`piserini-ray export --format NAME`), a registry as the
retrieval backends have one: a format is a function from a run (its config, its open store,
its directory) to the files it wrote in a folder. A new format is one entry here.

The writers (`formats/peer_writers.py`) load when a format is used: the command line builds its
parser from this registry without loading the reports' modules (matplotlib, SciPy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from piserini_ray.config import RunConfig
from piserini_ray.data import load_benchmark
from piserini_ray.errors import ConfigError
from piserini_ray.store import RunStore, manifest_config

#: (the run's config, its open store, its directory, the output folder) -> the files written.
Exporter = Callable[[RunConfig, RunStore, Path, Path], list[Path]]


@dataclass(frozen=True)
class ExportFormat:
    """One export format: its name on the command line, what it writes, and its writer."""

    name: str
    description: str
    export: Exporter


def _browsecomp_plus(config: RunConfig, store: RunStore, run_dir: Path, out: Path) -> list[Path]:
    # With their leaderboard's evaluation_summary.json: it needs the verdicts and the evidence.
    from piserini_ray.formats.imported import read_imported
    from piserini_ray.formats.peer_writers import export_browsecomp_plus

    imported = read_imported(run_dir)
    return export_browsecomp_plus(
        store.records(),
        out,
        store.judgements(config.judge_model().name),
        load_benchmark(config.benchmark).evidence,
        imported.retriever if imported else config.retrieval.describe(),
    )


def _pi_serini(config: RunConfig, store: RunStore, _run_dir: Path, out: Path) -> list[Path]:
    # Their run folder holds the questions and the qrels too.
    from piserini_ray.formats.peer_writers import export_pi_serini

    return export_pi_serini(store.records(), load_benchmark(config.benchmark), out)


def _trec(_config: RunConfig, store: RunStore, _run_dir: Path, out: Path) -> list[Path]:
    from piserini_ray.formats.peer_writers import export_trec

    return export_trec(store.rankings(), out, tag=store.run_id)


EXPORT_FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat(
            "browsecomp-plus",
            "one run_*.json per query and their leaderboard's evaluation_summary.json",
            _browsecomp_plus,
        ),
        ExportFormat(
            "pi-serini", "a Pi-Serini run folder with the questions and qrels", _pi_serini
        ),
        ExportFormat("trec", "every search's ranking as a TREC run file", _trec),
    )
}


def export_run(
    run_dir: Path, format_name: str, out: Path, log: Callable[[str], None]
) -> list[Path]:
    """Write the run in `run_dir` (read with its manifest's config) in the format named
    `format_name` into `out`; the files written."""
    if format_name not in EXPORT_FORMATS:
        raise ConfigError(
            f"unknown export format {format_name!r}: one of {', '.join(EXPORT_FORMATS)}"
        )
    config = manifest_config(run_dir)
    with RunStore(run_dir, config, log=log) as store:
        return EXPORT_FORMATS[format_name].export(config, store, Path(run_dir), out)
