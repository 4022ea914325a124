"""The batch ledgers of a run directory: provider batches written down when created and closed
when their results are in, so a driver killed while waiting polls a batch again instead of
paying for its requests twice.

- `batches.jsonl` (`JudgeBatchLedger`): the judge's batches (`judge.model.service_tier:
  batch`), custom id -> query id;
- `agent_batches.jsonl` (`TurnLedger`): the agent's turns (`llm/batcher.py`), with each reply.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from piserini_ray.store.jsonl import JsonlFile, Log


class JudgeBatchLedger:
    """`batches.jsonl`: each judge model's provider batches, created and not yet closed."""

    def __init__(self, path: Path, log: Log) -> None:
        self._file = JsonlFile(path, log)
        self._lock = threading.Lock()

    def note_batch(self, judge_model: str, batch_id: str, custom_ids: dict[str, str]) -> None:
        """A provider batch was created for `judge_model`'s verdicts (custom id -> query id):
        written before anyone polls it, so a driver killed while waiting resumes polling this
        batch instead of paying for its requests again."""
        row = {"judge_model": judge_model, "batch_id": batch_id, "custom_ids": custom_ids}
        with self._lock:
            self._file.append(row)

    def close_batch(self, judge_model: str, batch_id: str) -> None:
        """Every result of the batch is written (as verdicts, or left to a next batch)."""
        with self._lock:
            self._file.append({"judge_model": judge_model, "closed": batch_id})

    def open_batches(self, judge_model: str) -> dict[str, dict[str, str]]:
        """`judge_model`'s batches created and not closed: batch id -> custom id -> query id."""
        found: dict[str, dict[str, str]] = {}
        with self._lock:
            rows = self._file.read()
        for row in rows:
            if row.get("judge_model") != judge_model:
                continue
            if "closed" in row:
                found.pop(row["closed"], None)
            else:
                found[row["batch_id"]] = dict(row["custom_ids"])
        return found


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
