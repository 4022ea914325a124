"""Same code everywhere: the package version and a hash of its source, which every replica
reports so that a node running another `piserini_ray` than the driver is refused before any
query (its records would not be comparable, or its calls not even shaped alike)."""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path


@functools.cache
def code_identity() -> str:
    """`<version>+<first 12 hex of the SHA-256 of every .py file of the package>`."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    try:
        version = metadata.version("piserini_ray")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}+{digest.hexdigest()[:12]}"
