"""The run directory (docs/spec.md §5): the store is its one writer, and every file it owns is
crash-safe.

A run directory holds:
- `manifest.json`: run id, the config and its hash, versions, start time (written atomically;
  `store/manifest.py`);
- `records.jsonl`: one line per query, written once: the record with its rankings (every
  search's whole cached ranking), so a query is recorded completely or not at all;
- `judgements/<judge>.jsonl`: one verdict per query per judge model, written as each arrives;
- `spill/<query_id>/`: over-long tool outputs, written by the store (replicas return the text)
  just before the query's record, so they always sit in the run directory of the driver;
- `batches.jsonl`: provider batches of the judge (`judge.model.service_tier: batch`), each
  written when created and closed when its results are in, so a batch is polled, never paid
  twice; `agent_batches.jsonl` likewise for the agent's turns, with each reply
  (`store/ledgers.py`: `JudgeBatchLedger`, `TurnLedger`);
- the reports (`summary.json`, `report.md`, `report.html`, plots, `epochs.*`, ...), written by
  `reports/` through the store's one report writer, `store/report_files.py`;
- `status.json`, the run's live status, and `stop.request` while a stop is asked for, written
  through the same writer by `monitor/` (told of each record and verdict: `RunStore.listeners`).

Every JSONL goes through one `JsonlFile` (`store/jsonl.py`): an append is one line, flushed and
fsync'd before it returns; opening a file repairs a torn tail (a crash mid-write) by reporting
and cutting it off, so the next append never glues onto half a line; a damaged line that is not
the last stops with a message naming the file and line. Opening a run with a different config
is refused with a message that says how to start a new run or resume the old one. A query id can
be recorded once: `append` refuses a second record for it (`store/run_store.py`: `RunStore`).
"""

from __future__ import annotations

from piserini_ray.store.jsonl import JsonlFile, RunStoreError
from piserini_ray.store.ledgers import JudgeBatchLedger, TurnLedger
from piserini_ray.store.manifest import manifest_config, versions
from piserini_ray.store.report_files import fresh_report_folder, write_report_file
from piserini_ray.store.run_store import RunStore, read_served

__all__ = [
    "JsonlFile",
    "JudgeBatchLedger",
    "RunStore",
    "RunStoreError",
    "TurnLedger",
    "fresh_report_folder",
    "manifest_config",
    "read_served",
    "versions",
    "write_report_file",
]
