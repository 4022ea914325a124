"""The one writer of the report files a run directory (or a report folder) holds beside its
records: `summary.json`, `report.md`, `report.html` and its plots, `epochs.json` / `epochs.md`,
the evidence ranks, the trajectory viewer's files, `imported.json`, `estimate.json`, exports,
leaderboards and BM25 grids. Every module of `reports/` writes through here, never by itself.

A file is written whole or not at all (a temporary file beside it, renamed over it), so a report
read while it is being rewritten is the old one or the new one; text passes the one scrubber
(`llm/scrubber.py`) like every line of the run's records. No fsync: a report is made again from
the records, which are durable (`store/jsonl.py`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from piserini_ray.llm.scrubber import scrub, scrub_bytes


def write_report_file(path: Path, content: str | bytes, binary: bool = False) -> Path:
    """Write `content` to `path` (its folder created if missing), atomically; text (a `str`,
    or bytes of text such as JSON) is scrubbed, `binary` content (an image) is written as it
    is. Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        data = scrub(content).encode()
    else:
        data = content if binary else scrub_bytes(content)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def fresh_report_folder(path: Path) -> Path:
    """`path` emptied (made if missing): a folder of report files rewritten whole (the
    trajectory viewer's). Returns `path`."""
    path = Path(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
