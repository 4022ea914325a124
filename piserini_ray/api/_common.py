"""What every part of the API shares: the default log line and run directories from paths."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def stderr_log(message: str) -> None:
    print(f"[piserini-ray] {message}", file=sys.stderr, flush=True)


def run_paths(run_dirs: str | Path | Sequence[str | Path]) -> list[Path]:
    if isinstance(run_dirs, str | Path):
        return [Path(run_dirs)]
    return [Path(d) for d in run_dirs]
