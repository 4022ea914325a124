"""Hashing files by content: the one place that reads a file to name it.

Two callers, two needs, one hash: a run's identity names its data files by `file_identity`
(sampled for multi-GB files, cached in memory by `stamp`), and an index's file list
(`retrieval/index_files.py`) holds each file's full `sha256_of`, cached on disk by `stamp`.
It lives in the config layer, the lowest, so that both may import it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_BLOCK = 1 << 20
#: Files up to this size are named by their whole SHA-256; larger ones by `_SAMPLES` blocks.
_WHOLE_FILE_LIMIT = 64 << 20
_SAMPLES = 16


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def stamp(path: Path) -> str:
    """What changes whenever a file's bytes do: device, inode, size, mtime and ctime (a write
    sets ctime to now, and nothing but the clock sets it back)."""
    st = Path(path).stat()
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def file_identity(path: Path) -> str:
    """A data file's content identity: the SHA-256 of files up to 64 MiB; for larger ones (a
    multi-GB corpus) the size and 16 evenly spaced 1 MiB blocks, head and tail included, so
    that naming a run never reads gigabytes. A missing file is named by its path (loading it
    fails later with a clear error). Cached by the file's `stamp`."""
    try:
        key = stamp(path)
    except OSError:
        return f"missing:{path}"
    return _file_identity(str(path), key)


@functools.lru_cache(maxsize=64)
def _file_identity(path: str, stamp_key: str) -> str:
    size = Path(path).stat().st_size
    if size <= _WHOLE_FILE_LIMIT:
        return sha256_of(Path(path))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        step = (size - _BLOCK) / (_SAMPLES - 1)
        for i in range(_SAMPLES):
            f.seek(int(i * step))
            digest.update(f.read(_BLOCK))
    return f"{size}:{digest.hexdigest()}"
