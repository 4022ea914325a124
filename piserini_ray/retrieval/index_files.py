"""An index folder as a list of files with their sizes and SHA-256s: what a bare node checks a
shipped copy against (`engines/ray/shipping.py` moves the bytes).

The list's own hash is the index's content key: two folders with the same key hold the same
index, byte for byte. The list is cached beside the index (`files.json`, keyed by each file's
device, inode, size, modification and change times: `stamp`), so hashing a multi-GB index
happens once on the node that has it. Hashing itself (`sha256_of`, `stamp`) is
`config/hashing.py`'s, shared with a run's identity.

A list names only the index's own files, by safe relative names (no `..`, no absolute name, no
empty segment): a list that names anything else is refused when it is read. A folder matches a
list (`damaged_files`) only when every listed file hashes to the list's SHA-256 and no other
file is there (Lucene opens the newest `segments_N` it finds). A file's hash is trusted again
only while its `stamp` is the one it was hashed at: writing a file changes its change time
(`st_ctime`), which no user can set back. A file changed within `SETTLE_NS` is never recorded
(the kernel's file clock ticks in milliseconds: a write in the same tick as the hash would keep
the stamp; git calls such files "racily clean").
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, Field, field_validator

from piserini_ray.config.hashing import sha256_of, stamp

#: Files of an index folder that are not part of the index (caches, locks, this list), by name
#: at any depth: Lucene leaves its `write.lock` in the `lucene/` folder it wrote.
_NOT_INDEX = {"files.json", ".lock", "write.lock"}
#: A file's hash is recorded only once its last change is this old (nanoseconds).
SETTLE_NS = 2_000_000_000


_SHA256 = re.compile(r"[0-9a-f]{64}")


def unsafe_name(relative: str) -> str | None:
    """Why `relative` is not a safe name of a file inside an index folder, or None."""
    if not relative or relative.startswith("/") or "\\" in relative or "\0" in relative:
        return "not a relative name"
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, `.` or `..` segment"
    if parts[-1] in _NOT_INDEX or ".tmp" in Path(parts[-1]).suffixes:
        return "is not a file of an index"
    return None


class IndexFile(BaseModel):
    path: str  # relative to the index folder, with "/"
    size: int = Field(ge=0)
    sha256: str

    @field_validator("path")
    @classmethod
    def _safe(cls, value: str) -> str:
        if problem := unsafe_name(value):
            raise ValueError(f"index file {value!r} {problem}")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.fullmatch(value):
            raise ValueError(f"{value!r} is not a SHA-256")
        return value


class IndexFiles(BaseModel):
    name: str  # the index folder's name (`<corpus>-<fingerprint>`)
    files: list[IndexFile]

    @field_validator("name")
    @classmethod
    def _one_component(cls, value: str) -> str:
        if not value or "/" in value or "\\" in value or value in (".", "..") or "\0" in value:
            raise ValueError(f"index name {value!r} is not a single folder name")
        return value

    @field_validator("files")
    @classmethod
    def _once_each(cls, value: list[IndexFile]) -> list[IndexFile]:
        if len({f.path for f in value}) != len(value):
            raise ValueError("an index file is listed twice")
        return value

    def checked(self) -> IndexFiles:
        """This list validated again: one that crossed a process (Ray unpickles models
        without validating them) is trusted only after this."""
        return IndexFiles.model_validate(self.model_dump())

    @property
    def content_key(self) -> str:
        rows = [f"{f.path}\0{f.size}\0{f.sha256}" for f in self.files]
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:24]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def _not_index(path: Path) -> bool:
    return path.name in _NOT_INDEX


def _members(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not _not_index(p) and ".tmp" not in p.suffixes
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


def index_files(folder: Path) -> IndexFiles:
    """The folder's file list (hashing only files whose `stamp` changed since the cached list
    was made)."""
    cache_path = folder / "files.json"
    cached = read_json_cache(cache_path)
    files, stamps = [], {}
    for path in _members(folder):
        relative = path.relative_to(folder).as_posix()
        stat = path.stat()
        stamp_now = stamp(path)
        known = cached.get(relative)
        if isinstance(known, dict) and known.get("stamp") == stamp_now:
            digest = str(known["sha256"])
        else:
            digest = sha256_of(path)
        stamps[relative] = {"stamp": stamp_now, "sha256": digest}
        files.append(IndexFile(path=relative, size=stat.st_size, sha256=digest))
    if stamps != cached:
        write_json_cache(cache_path, stamps)
    return IndexFiles(name=folder.name, files=files)


def damaged_files(
    folder: Path, expected: IndexFiles, verified: dict[str, Any] | None = None
) -> list[str]:
    """What keeps `folder` from being `expected`: each listed file that is missing or does not
    hash to its SHA-256, and each file there that the list does not name. Every file is
    hashed, except one whose `stamp` `verified` holds with the same SHA-256 (a record this node
    made when it last hashed it); `verified` is updated with every file that hashed right."""
    bad = []
    for item in expected.files:
        path = folder / item.path
        if not path.is_file() or path.is_symlink():
            bad.append(item.path)
            continue
        record = {"stamp": stamp(path), "sha256": item.sha256}  # taken before hashing
        if verified is not None and verified.get(item.path) == record:
            continue
        if path.stat().st_size != item.size or sha256_of(path) != item.sha256:
            bad.append(item.path)
        elif verified is not None and path.stat().st_ctime_ns < time.time_ns() - SETTLE_NS:
            verified[item.path] = record
    listed = {item.path for item in expected.files}
    if folder.is_dir():  # anything else there, temporary files included, is refused
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder).as_posix()
            if path.is_dir() and not path.is_symlink():
                continue
            if relative not in listed and not _not_index(path):
                bad.append(f"{relative} (not in the index's file list)")
    return bad
