"""An index folder as a list of files with their sizes and SHA-256s: what a bare node checks a
shipped copy against (`runtime/shipping.py` moves the bytes).

The list's own hash is the index's content key: two folders with the same key hold the same
index, byte for byte. The list is cached beside the index (`files.json`, keyed by each file's
size and modification time), so hashing a multi-GB index happens once on the node that has it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

#: Files of an index folder that are not part of the index (caches, locks, this list).
_NOT_INDEX = {"files.json", ".lock", "write.lock"}
_BLOCK = 1 << 20


class IndexFile(BaseModel):
    path: str  # relative to the index folder, with "/"
    size: int
    sha256: str


class IndexFiles(BaseModel):
    name: str  # the index folder's name (`<corpus>-<fingerprint>`)
    files: list[IndexFile]

    @property
    def content_key(self) -> str:
        rows = [f"{f.path}\0{f.size}\0{f.sha256}" for f in self.files]
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:24]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def _members(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.name not in _NOT_INDEX and ".tmp" not in p.suffixes
    )


def read_json_cache(path: Path) -> dict[str, Any]:
    """A JSON cache file's mapping; {} when it is missing or damaged (which only costs a
    recomputation)."""
    try:
        data = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_cache(path: Path, data: dict[str, Any]) -> None:
    """Replace a JSON cache file whole (a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(data))
    tmp.replace(path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def index_files(folder: Path) -> IndexFiles:
    """The folder's file list (hashing only files whose size or mtime changed since the cached
    list was made)."""
    cache_path = folder / "files.json"
    cached = read_json_cache(cache_path)
    files, stamps = [], {}
    for path in _members(folder):
        relative = path.relative_to(folder).as_posix()
        stat = path.stat()
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
        known = cached.get(relative)
        digest = known["sha256"] if known and known.get("stamp") == stamp else sha256_of(path)
        stamps[relative] = {"stamp": stamp, "sha256": digest}
        files.append(IndexFile(path=relative, size=stat.st_size, sha256=digest))
    if stamps != cached:
        write_json_cache(cache_path, stamps)
    return IndexFiles(name=folder.name, files=files)


def damaged_files(folder: Path, expected: IndexFiles) -> list[str]:
    """The files of `folder` that are missing or differ from `expected` (each re-hashed: a
    shipped copy is checked whole before it is used)."""
    bad = []
    for item in expected.files:
        path = folder / item.path
        if not path.is_file() or path.stat().st_size != item.size or sha256_of(path) != item.sha256:
            bad.append(item.path)
    return bad
