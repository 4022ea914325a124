"""Command line: `piserini-ray COMMAND` (or `python -m piserini_ray.cli COMMAND`).

A client of the package: each command parses its arguments, calls the API (`piserini_ray.api`)
and prints; it never imports an engine, the engine contract or the pipeline (an import-linter
contract). It writes no file itself: the run store and the report writers (`reports/writers.py`,
`formats/exporter.py`) do.

- `parser`: the argument parser, every command and argument;
- `common`: the config from the arguments, the log line;
- `runs`: run, resume, sweep, estimate, judge, report;
- `analysis`: compare, leaderboard, power, export, import, evidence-ranks, pricing check;
- `retrieval`: index, search, read, tune-bm25, retrieval-eval;
- `live`: ask, offline-provider;
- `monitor`: status, watch, stop.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from piserini_ray.cli.parser import build_parser
from piserini_ray.errors import PiseriniRayError

__all__ = ["build_parser", "entry", "main"]


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line (`argv`, default `sys.argv[1:]`); its exit status: 0, 1 when
    queries failed (or a check found a difference), 2 on bad input with a message naming it,
    130 when interrupted."""
    args = build_parser().parse_args(argv)
    # Ctrl-C and SIGTERM (what cluster schedulers send) both stop a run cleanly. Installed
    # explicitly: a process started in the background inherits an ignored SIGINT.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        status: int = args.func(args)
        return status
    except PiseriniRayError as e:
        print(f"piserini-ray: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("piserini-ray: interrupted", file=sys.stderr)
        return 130


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """A command's own process (`piserini-ray`, `python -m piserini_ray.cli`, the jobs): `main`,
    then exit with its status. What the command leaves behind (modules, records, clients) is
    frozen out of the garbage collector first: Python's collections at exit walked all of it
    for about 2 s after the report was printed, in a process with nothing left to collect.
    atexit handlers and finalization still run. (`main` alone, in a long-lived process, does
    not freeze anything.)"""
    status = main(argv)
    gc.freeze()
    sys.exit(status)
