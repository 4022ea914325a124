"""Spill files: the full text of a tool output too long to show the agent (docs/spec.md §3)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_component(value: str, max_len: int = 60) -> str:
    """A file-name piece that cannot escape its folder, whatever `value` holds.

    A value that is already safe is kept; otherwise unsafe characters become `_`, leading dots
    are dropped, and a short hash of the original keeps two values from colliding after cleaning.
    """
    cleaned = _UNSAFE.sub("_", value).lstrip(".")[:max_len] or "x"
    if cleaned == value:
        return value
    digest = hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{cleaned}-{digest}"


def spill_name(sequence: int, tool: str, subject: str, span: str) -> str:
    """`{sequence}-{tool}-{subject}-{span}.txt`, safe as a file name whatever the parts hold."""
    return f"{sequence:04d}-{tool}-{safe_component(subject)}-{safe_component(span, 40)}.txt"


def write_spill_file(folder: Path, name: str, text: str) -> Path:
    """Write `text` to `folder/name`; return the path. `name` comes from `spill_name` (or a
    record), and must not leave the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if safe_component(name) != name or path.resolve().parent != folder.resolve():
        raise ValueError(f"spill file name {name!r} escapes {folder}")
    path.write_text(text, encoding="utf-8")
    return path


def truncate(text: str, max_lines: int, max_bytes: int) -> tuple[str, bool]:
    """Cut `text` to at most `max_lines` lines and `max_bytes` UTF-8 bytes (on a line end)."""
    lines = text.split("\n")
    cut = False
    if len(lines) > max_lines:
        lines, cut = lines[:max_lines], True
    out: list[str] = []
    size = 0
    for line in lines:
        size += len(line.encode("utf-8")) + 1
        if size > max_bytes:
            cut = True
            if not out:  # a single huge line: cut inside it, on a character boundary
                out.append(line.encode("utf-8")[:max_bytes].decode("utf-8", "ignore"))
            break
        out.append(line)
    return "\n".join(out), cut
