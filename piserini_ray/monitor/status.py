"""A run's live status, `status.json` in its run directory (docs/guides/monitoring.md): what the
status command, the web view and the progress line read while the run goes on, and after.

The file is small and rewritten whole (`store.write_report_file`: a reader sees the old file or
the new one, never half of one) by the driver's `StatusBoard` (`monitor/board.py`) every few
seconds while anything changed, and at the end. A reader never opens the run's store (its lock
is the driver's): it reads this file, and `stale` tells a driver that died from one that runs.
A stop request is a file beside it (`stop.request`) that the driver's board looks for.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, Field, ValidationError

from piserini_ray.errors import PiseriniRayError
from piserini_ray.store import write_report_file

STATUS_FILE = "status.json"
STOP_FILE = "stop.request"

#: `running`: queries are being run; `judging`: the queries are done and the rest of the
#: answers are being judged; `finished`: reported; `stopped`: a stop request (or the cost cap,
#: or the failure policy) ended it before its slice was done; `decided`: its comparison with the
#: sweep's reference was decided (`stop_when_decided`); `interrupted`: Ctrl-C or an error.
State = Literal["running", "judging", "finished", "stopped", "decided", "interrupted"]
#: The states in which a driver is expected to rewrite the file.
LIVE_STATES: tuple[State, ...] = ("running", "judging")
#: A live status older than this many of its own intervals (and at least `STALE_FLOOR`
#: seconds) is stale: its driver stopped writing it.
STALE_INTERVALS = 5
STALE_FLOOR = 20.0


def stale_after(every_seconds: float) -> float:
    """Seconds after which a live status that was not rewritten is stale."""
    return max(STALE_FLOOR, STALE_INTERVALS * every_seconds)


def heartbeat_seconds(every_seconds: float) -> float:
    """A live run with nothing new (a sweep's run waiting its turn, or done with its queries
    while the others go on) is rewritten this often all the same, so it never reads stale."""
    return stale_after(every_seconds) / 4


class MonitorError(PiseriniRayError):
    """A path with no run, a port taken, a run that cannot be stopped."""


class RunStatus(BaseModel):
    """One run's live figures (`status.json`). Counts are of the records on disk when it was
    written; `accuracy_judged` is over the answers the run's judge has graded so far."""

    schema_version: int = 1
    run_dir: str
    run_id: str
    model: str
    #: The judge whose verdicts `judged`, `correct` and `accuracy_judged` count.
    judge_model: str
    state: State
    host: str
    pid: int
    #: When this execution began, and when the file was written (ISO 8601, UTC).
    started_at: str
    updated_at: str
    #: How often the driver rewrites the file while it runs.
    every_seconds: float
    #: Queries in the run's slice.
    queries: int
    #: Records on disk by status (completed, timeout, failed).
    recorded: dict[str, int] = Field(default_factory=dict)
    #: Queries this execution had to run when it began, and how many of them it recorded.
    todo_at_start: int = 0
    ran_now: int = 0
    running: int = 0
    #: The run's model calls waiting on its quota key's limiter (shared by the runs of a key).
    waiting_on_limiter: int = 0
    #: Failed attempts that were retried, by failure class (rate_limit, transient, ...).
    retries: dict[str, int] = Field(default_factory=dict)
    #: Tokens of the recorded queries by kind (the `Usage` fields).
    tokens: dict[str, int] = Field(default_factory=dict)
    #: USD of the recorded queries (None: the model has no price); of that, the estimate for
    #: calls cut at the budget or failed after sending.
    cost_usd: float | None = None
    cost_estimated_usd: float | None = None
    judged: int = 0
    correct: int = 0
    judge_failed: int = 0
    accuracy_judged: float | None = None
    #: The 95 % bootstrap interval of `accuracy_judged` (the report's method and seed).
    accuracy_ci95: tuple[float, float] | None = None
    #: Queries recorded per minute by this execution, and the seconds left at that pace.
    queries_per_minute: float | None = None
    eta_seconds: float | None = None
    #: Searcher replicas by node address (`local` for the local engine).
    replicas: dict[str, int] = Field(default_factory=dict)
    #: Why the run stopped before its slice was done, if it did.
    stopped: str | None = None
    #: Records of queries cut by a stop request (retryable failures: a resume runs them).
    cut_by_stop: int = 0

    @property
    def recorded_total(self) -> int:
        return sum(self.recorded.values())


class StatusView(BaseModel):
    """A status as a reader sees it: the file, its age, and whether its driver is gone."""

    status: RunStatus
    age_seconds: float
    #: The status says the run is live, but its driver stopped writing it (it died or was
    #: killed): resume the run to continue it.
    stale: bool

    @property
    def state(self) -> str:
        return "stale" if self.stale else self.status.state


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def this_host() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def view(status: RunStatus) -> StatusView:
    """`status` with its age and staleness: a live state that was not rewritten for
    `STALE_INTERVALS` intervals, or whose driver on this host is gone, is stale."""
    updated = datetime.fromisoformat(status.updated_at)
    age = max(0.0, (datetime.now(UTC) - updated).total_seconds())
    stale = False
    if status.state in LIVE_STATES:
        too_old = age > stale_after(status.every_seconds)
        gone = status.host == this_host() and not _pid_alive(status.pid)
        stale = too_old or gone
    return StatusView(status=status, age_seconds=round(age, 1), stale=stale)


def read_status(run_dir: Path) -> StatusView | None:
    """The status of the run in `run_dir`, None when it has none yet (or it cannot be read
    whole: it is rewritten atomically, so that is a file of another version or damaged)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        return view(RunStatus.model_validate(orjson.loads(path.read_bytes())))
    except (OSError, orjson.JSONDecodeError, ValidationError):
        return None


def run_dirs_under(path: Path) -> list[Path]:
    """The run directories at or under `path` (a run directory, a sweep's root, a runs root):
    every folder with a `manifest.json`, sorted; an error naming `path` when there is none."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise MonitorError(
            f"{path} is not a folder; give a run directory or a folder of runs (a sweep's "
            "root, or the runs root that `piserini-ray run` prints)"
        )
    if (path / "manifest.json").exists():
        found = [path]
        epochs = path / "epochs"
        if epochs.is_dir():
            found += sorted(p.parent for p in epochs.glob("*/manifest.json"))
        return found
    found = sorted(p.parent for p in path.glob("**/manifest.json"))
    if not found:
        raise MonitorError(
            f"no run under {path} (no folder with a manifest.json); give a run directory or a "
            "folder of runs, such as the runs root that `piserini-ray run` prints"
        )
    return found


def request_stop(run_dir: Path) -> Path:
    """Ask the driver of the run in `run_dir` to stop it: a `stop.request` file its board
    finds within a second. An error when the run is not running (nothing would read it)."""
    run_dir = Path(run_dir).absolute()
    if not (run_dir / "manifest.json").exists():
        raise MonitorError(f"{run_dir} is not a run directory (it has no manifest.json)")
    seen = read_status(run_dir)
    if seen is None or seen.status.state not in LIVE_STATES or seen.stale:
        said = "has no status yet" if seen is None else f"is {seen.state}"
        raise MonitorError(
            f"the run in {run_dir} {said}: there is nothing to stop. A stopped run resumes "
            "when its command runs again"
        )
    path = run_dir / STOP_FILE
    request = {"requested_at": now_iso(), "host": this_host()}
    return write_report_file(path, orjson.dumps(request))
