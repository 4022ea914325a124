"""Runs while they go: their status, a live page, asking one to stop and waiting until it has."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piserini_ray.monitor.status import StatusView
    from piserini_ray.monitor.web import Watch


def run_status(path: str | Path) -> list[tuple[Path, StatusView | None]]:
    """Each run's live status under a path, from the status file its driver keeps: what
    `piserini-ray status` shows. Read from any process or host that sees the files.

    Args:
        path: a run directory, a sweep's folder or a runs root.

    Returns:
        Each run directory under `path` with its `StatusView` (`None`: no status yet):
        `.state` (`"stale"` when its driver stopped writing: it died or was killed),
        `.status` (counts, cost, accuracy so far, ETA, replicas) and `.age_seconds`.

    Raises:
        PiseriniRayError: there is no run under `path`.

    Example:
        ```python
        from piserini_ray import run_status

        for run_dir, seen in run_status("runs"):
            print(run_dir, seen.state if seen else "no status yet")
        ```
    """
    from piserini_ray.monitor.status import read_status, run_dirs_under

    return [(run_dir, read_status(run_dir)) for run_dir in run_dirs_under(Path(path))]


def watch(path: str | Path, host: str = "127.0.0.1", port: int = 8765) -> Watch:
    """Serve a live web view of the runs under a path on a thread of its own: what
    `piserini-ray watch` does. Off loopback, every request needs the token in its URL.

    Args:
        path: a run directory, a sweep's folder or a runs root.
        host: the address to listen on (default loopback).
        port: the port (0: any free port).

    Returns:
        A `Watch`: its `url` (with the token), its `thread`, and `close()` to stop it.

    Raises:
        PiseriniRayError: no run under `path`, or the port is taken.

    Example:
        ```python
        from piserini_ray import watch

        view = watch("runs", port=0)
        print(view.url)
        view.close()
        ```
    """
    from piserini_ray.monitor.web import start_watch

    return start_watch(Path(path), host, port)


def request_stop(run_dir: str | Path) -> Path:
    """Ask a run's driver to stop that run cleanly (the other runs of its sweep go on), from
    any process: what `piserini-ray stop` does first. The run resumes when run again.

    Args:
        run_dir: the run directory.

    Returns:
        The request's file (the driver stops the run within a second of seeing it).

    Raises:
        PiseriniRayError: the run is not running.

    Example:
        ```python
        from piserini_ray import request_stop, wait_until_stopped

        request_stop("runs/sweep/a")
        print(wait_until_stopped("runs/sweep/a"))
        ```
    """
    from piserini_ray.monitor.status import request_stop as request

    return request(Path(run_dir))


#: How often `wait_until_stopped` looks whether the run has stopped.
STOP_POLL_SECONDS = 0.5


def wait_until_stopped(run_dir: str | Path, timeout: float = 120.0) -> StatusView | None:
    """Wait until a run asked to stop has stopped (or is judging: its queries are done and
    its answers are left to be judged): what `piserini-ray stop` does next.

    Args:
        run_dir: the run directory.
        timeout: seconds to wait at most.

    Returns:
        The run's `StatusView` once it stopped; `None` when its status still said running at
        the timeout.

    Example:
        ```python
        from piserini_ray import request_stop, wait_until_stopped

        request_stop("runs/sweep/a")
        seen = wait_until_stopped("runs/sweep/a", timeout=30)
        print("still running" if seen is None else seen.state)
        ```
    """
    import time

    from piserini_ray.monitor.status import LIVE_STATES, read_status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = read_status(Path(run_dir))
        if seen is not None and (seen.stale or seen.status.state not in LIVE_STATES):
            return seen
        if seen is not None and seen.status.state == "judging":
            return seen  # its queries are done: judging the answers is left to finish
        time.sleep(STOP_POLL_SECONDS)
    return None
