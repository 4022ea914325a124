"""`RunStore`: one run directory opened for one config, its lock held while open; the one
writer of its records, verdicts and spill files (`store/__init__.py` maps the whole directory).
"""

from __future__ import annotations

import fcntl
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from piserini_ray.config import RunConfig
from piserini_ray.llm.scrubber import scrub
from piserini_ray.records import Judgement, QueryRecord, RankingLog, ServedTime, Usage
from piserini_ray.store.jsonl import JsonlFile, Log, RunStoreError, rewrite_without
from piserini_ray.store.ledgers import JudgeBatchLedger
from piserini_ray.store.manifest import open_manifest


class StoreListener(Protocol):
    """Told of every record and verdict once it is on disk (the run's live status board,
    `monitor/board.py`): what it shows derives from the same events the files hold."""

    def recorded(self, record: QueryRecord) -> None: ...

    def judged(self, judgement: Judgement) -> None: ...


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
        #: Told of each record and verdict after it is written (`StoreListener`).
        self.listeners: list[StoreListener] = []
        #: `batches.jsonl`: the judge's provider batches in flight (`store/ledgers.py`).
        self.judge_batches = JudgeBatchLedger(self.run_dir / "batches.jsonl", self._log)
        self._check_writable()
        try:
            self.manifest, self.config_hash = open_manifest(self.run_dir, config, self._log)
        except RunStoreError:
            self.close()
            raise
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
        for listener in self.listeners:
            listener.judged(judgement)

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
                rewrite_without(JsonlFile(path, self._log), query_ids, None)
            self._judgements.clear()
            moved = rewrite_without(
                self._records,
                query_ids,
                JsonlFile(self.run_dir / "records.retried.jsonl", self._log),
            )
            self._done -= query_ids
            for query_id in query_ids:
                self._failed.pop(query_id, None)
        return moved

    def add_served(self, served: ServedTime) -> None:
        """Charge this run a served model's server-seconds (`served.jsonl`, durable)."""
        with self._lock:
            JsonlFile(self.run_dir / "served.jsonl", self._log).append(
                served.model_dump(mode="json")
            )

    def served(self) -> list[ServedTime]:
        """Every execution's server-seconds charged to this run."""
        return read_served(self.run_dir, self._log)

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
        for listener in self.listeners:
            listener.recorded(record)

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


def read_served(run_dir: Path, log: Log = None) -> list[ServedTime]:
    """The server-seconds charged to the run in `run_dir` (`served.jsonl`; none: [])."""
    path = Path(run_dir) / "served.jsonl"
    if not path.exists():
        return []
    return [ServedTime.model_validate(row) for row in JsonlFile(path, log).iter()]
