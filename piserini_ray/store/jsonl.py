"""The crash-safe JSONL file every record, verdict and ledger of a run goes through.

An append is one line, scrubbed (`llm/scrubber.py`), flushed and fsync'd before it returns;
opening a file repairs a torn tail (a crash mid-write) by reporting and cutting it off, so the
next append never glues onto half a line; a damaged line that is not the last stops with a
message naming the file and line. `rewrite_without` takes queries' lines out atomically.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from piserini_ray.errors import PiseriniRayError
from piserini_ray.llm.scrubber import scrub_bytes


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
        # Every line of every run file passes the one scrubber (`llm/scrubber.py`).
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


def rewrite_without(file: JsonlFile, drop: set[str], keep_dropped: JsonlFile | None) -> int:
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
