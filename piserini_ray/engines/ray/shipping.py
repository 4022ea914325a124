"""Data ships to bare nodes: a replica on a node without the index gets it from the node that
has it, through Ray, verified by the index's content key, and keeps it under that node's
`PISERINI_RAY_HOME` for the next run.

The driver's node (where `prepare` built or found the index) serves its bytes, in chunks,
from the job's actor there (`driver_services.py`: one light worker for the limiters, the
index and the endpoints, not one each); the driver hands each replica the index's file list
(`retrieval/index_files.py`). A replica (`local_index`) uses, in order: the driver's own
folder where this node can read it (the same node, or shared storage every node mounts); a copy
shipped earlier; else a new copy, fetched chunk by chunk, checked whole, then moved into place.
Queries, qrels and the corpus stay on the driver: a replica needs only the index.

Only the driver's list is trusted. The list is validated again where it arrives (safe relative
names only: no `..`, no absolute name). A folder is used only when every listed file hashes to
the list's SHA-256 and no other file is there (`index_files.damaged_files`): matching names and
sizes are not enough. Each received chunk must have the length asked for. So that a node does
not hash a multi-GB index for every replica it starts, it keeps a record of the files it
hashed, each with its `stamp` (inode, size, mtime and ctime: any write changes it), under its
own `PISERINI_RAY_HOME` (`indexes/verified/`), and hashes again any file whose stamp moved.

A replica fetches on its start-up thread, off its event loop; it waits on each chunk's future
(`ObjectRef.future()`) on that thread only, never with `ray.get`, which Ray refuses to see in
an async actor's process ("Using blocking ray.get inside async actor": it blocks the loop).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

import ray
from pydantic import BaseModel, ValidationError

from piserini_ray.config import default_home
from piserini_ray.engines.ray.driver_services import services_name
from piserini_ray.errors import DataError
from piserini_ray.retrieval.index import locked
from piserini_ray.retrieval.index_files import (
    IndexFiles,
    damaged_files,
    index_files,
    read_json_cache,
    unsafe_name,
    write_json_cache,
)

#: Bytes per chunk, and bytes in flight per fetch: big enough to stream at disk speed, small
#: enough that a fetch holds a few dozen MB of the object store at once. Counted in bytes, not
#: chunks: an index has dozens of small files (one chunk each), which are all asked for at once
#: rather than four round trips at a time.
CHUNK_BYTES = 8 << 20
IN_FLIGHT_BYTES = 4 * CHUNK_BYTES


class IndexSource(BaseModel):
    """Where a replica finds its index: the folder on the driver's node (`node`), its file
    list, and the name of the actor there that serves its bytes (`driver_services.py`)."""

    path: str
    files: IndexFiles
    server: str
    node: str | None = None


def serve_index(folder: Path) -> IndexSource:
    """The replicas' source of the index at `folder` on this (the driver's) node, served by
    the job's actor here (`driver_services(start=True)`, which the driver starts with the
    replicas)."""
    files = index_files(folder)
    return IndexSource(
        path=str(folder),
        files=files,
        server=services_name(),
        node=ray.get_runtime_context().get_node_id(),
    )


def _same_sizes(folder: Path, files: IndexFiles) -> bool:
    return (folder / "index.json").is_file() and all(
        (folder / f.path).is_file() and (folder / f.path).stat().st_size == f.size
        for f in files.files
    )


def _record(folder: Path, files: IndexFiles) -> Path:
    """Where this node keeps what it hashed of `folder` for the index `files`."""
    where = hashlib.sha256(str(folder.absolute()).encode()).hexdigest()[:16]
    return default_home() / "indexes" / "verified" / f"{files.content_key}-{where}.json"


def verified(folder: Path, files: IndexFiles, record: Path | None = None) -> list[str]:
    """`damaged_files` of `folder` against the driver's list, every file hashed unless this
    node's record (`record`, default `_record`) holds it at its current stamp; the record keeps
    what hashed right."""
    record = record or _record(folder, files)
    known = read_json_cache(record)
    bad = damaged_files(folder, files, known)
    record.parent.mkdir(parents=True, exist_ok=True)
    write_json_cache(record, {path: known[path] for path in known if path not in bad})
    return bad


def trusted_list(source: IndexSource) -> IndexFiles:
    """The driver's file list, validated here (Ray hands models over without validating)."""
    try:
        return source.files.checked()
    except ValidationError as error:
        raise DataError(
            source.path,
            f"the driver's index file list names unsafe files: {error}",
        ) from None


def local_index(source: IndexSource, log: Any = print) -> Path:
    """The index folder this node uses for `source` (see the module's docstring)."""
    files = trusted_list(source)
    here = Path(source.path)
    home = default_home() / "indexes" / "shipped" / files.content_key
    home.mkdir(parents=True, exist_ok=True)
    target = home / files.name
    with locked(home / ".lock"):  # one check and one fetch per node, however many replicas
        if _same_sizes(here, files):  # the driver's node, or storage every node shares
            bad = verified(here, files)
            if not bad:
                return here
            log(
                f"index {files.name}: the folder {here} does not match the driver's file list "
                f"({len(bad)} file(s), e.g. {bad[0]}); using a copy shipped to this node"
            )
        if target.exists():
            bad = verified(target, files)
            if not bad:
                log(f"index {files.name}: the copy shipped to this node earlier ({target})")
                return target
            log(
                f"index {files.name}: the copy at {target} is damaged ({len(bad)} file(s), e.g. "
                f"{bad[0]}); fetching it again"
            )
            shutil.rmtree(target)
        _fetch(source, files, target, log)
    return target


def _fetch(source: IndexSource, files: IndexFiles, target: Path, log: Any) -> None:
    server = ray.get_actor(source.server)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    origin: Any = server.where.remote()  # (for the log line: asked now, not after the last chunk)
    pieces = [
        (item.path, offset, min(CHUNK_BYTES, item.size - offset))
        for item in files.files
        for offset in range(0, max(item.size, 1), CHUNK_BYTES)
    ]
    pending: deque[tuple[tuple[str, int, int], Any]] = deque()
    in_flight = 0
    for piece in pieces:
        while pending and in_flight + piece[2] > IN_FLIGHT_BYTES:
            in_flight -= pending[0][0][2]
            _write(partial, *pending.popleft())
        pending.append((piece, server.chunk.remote(source.path, *piece)))
        in_flight += piece[2]
    while pending:
        _write(partial, *pending.popleft())
    # Hashed whole; what hashed right is recorded for the target it becomes (a rename moves
    # no file's inode or times).
    bad = verified(partial, files, _record(target, files))
    if bad:
        shutil.rmtree(partial, ignore_errors=True)
        raise DataError(
            str(target),
            f"the shipped index does not match its file list ({len(bad)} file(s), e.g. {bad[0]}):"
            " the index changed on the driver's node while it was shipped; run again",
        )
    partial.rename(target)
    seconds = time.monotonic() - started
    log(
        f"index {files.name}: shipped from node {_result(origin)} to "
        f"{target}: {files.bytes:,} bytes in {seconds:.1f} s "
        f"({files.bytes / max(seconds, 1e-6) / 2**20:.1f} MiB/s), content key {files.content_key}"
    )


def _result(ref: Any) -> Any:
    """The value of `ref`, waited for on this thread only (see the module's docstring)."""
    return ref.future().result()


def _write(folder: Path, piece: tuple[str, int, int], ref: Any) -> None:
    write_chunk(folder, piece, _result(ref))


def write_chunk(folder: Path, piece: tuple[str, int, int], data: bytes) -> None:
    """Put one received chunk in place: only under `folder`, at a safe name of the list, and
    only with the length that was asked for."""
    relative, offset, size = piece
    if problem := unsafe_name(relative):
        raise DataError(relative, f"refused: an index file name that {problem}")
    if len(data) != size:
        raise DataError(
            str(folder / relative),
            f"a chunk at offset {offset} came with {len(data)} bytes, not {size}: the index "
            "changed on the driver's node while it was shipped; run again",
        )
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.seek(offset)
        f.write(data)
