"""The driver's `StatusBoard` of one run: it learns each record and verdict as the store writes
it (the store's listener: the same events the records hold), the engine's gauges (queries
running, calls waiting on the limiter, replicas by node), and rewrites `status.json` from them
every few seconds on a thread of its own, never on the run's path. It also looks for a stop
request (`piserini-ray stop`) and raises the run's stop flag.

Accuracy so far has a Wilson interval while the run goes on (pure arithmetic: the board's thread
imports nothing, and SciPy's first import on a second thread has raced the driver's own); the
status written with the reports (`final_status`) carries the report's bootstrap interval.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable

from piserini_ray.config import RunConfig
from piserini_ray.metrics.cost import Price
from piserini_ray.monitor.status import (
    STATUS_FILE,
    STOP_FILE,
    RunStatus,
    State,
    heartbeat_seconds,
    now_iso,
    read_status,
    this_host,
)
from piserini_ray.records import Judgement, QueryRecord, Usage
from piserini_ray.store import RunStore, RunStoreError, write_report_file

Log = Callable[[str], None]
#: How often the board's thread looks for a stop request (and a due rewrite).
POLL_SECONDS = 0.5
#: The termination of a query cut by a stop request (`agent.loop`): retryable, not counted
#: against the failure policy.
STOPPED = "stopped"
STOP_REASON = "stopped on request (piserini-ray stop); run the same command to resume it"


def wilson(correct: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """The 95 % Wilson score interval of `correct` / `n` (None without any)."""
    if n == 0:
        return None
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def retry_class(reason: str) -> str:
    """A retried attempt's failure class: the first word of its line (`llm/client.py` writes
    `rate_limit, waiting 1.00 s: ...`)."""
    return reason.split(",", 1)[0].split(":", 1)[0].strip() or "unknown"


class StatusBoard:
    """The live figures of one run's execution, and the thread that writes them."""

    def __init__(
        self,
        store: RunStore,
        config: RunConfig,
        price: Price | None,
        wanted: set[str],
        todo: int,
        log: Log,
        every: float,
        state: State = "running",
    ) -> None:
        self.path = store.run_dir / STATUS_FILE
        self._stop_path = store.run_dir / STOP_FILE
        self._log = log
        self._price = price
        self._wanted = wanted
        self._lock = threading.Lock()
        self._judge = config.judge_model().name
        #: When this execution's first query of the run was in flight: the pace counts from
        #: there (a sweep's run that waited its turn would otherwise read as slow).
        self._began: float | None = None
        self._created = time.monotonic()
        self.status = RunStatus(
            run_dir=str(store.run_dir),
            run_id=store.run_id,
            model=config.model.name,
            judge_model=self._judge,
            state=state,
            host=this_host(),
            pid=os.getpid(),
            started_at=now_iso(),
            updated_at=now_iso(),
            every_seconds=every,
            queries=len(wanted),
            todo_at_start=todo,
            cost_usd=0.0 if price is not None else None,
            cost_estimated_usd=0.0 if price is not None else None,
        )
        self._usage = Usage()
        self._verdicts: dict[str, bool | None] = {}  # query -> correct (None: judge failed)
        self._recorded: set[str] = set()
        for record in store.iter_records():
            if record.query_id in wanted:
                self._count(record)
        for query_id, judgement in store.judgements(self._judge).items():
            if query_id in wanted:
                self._verdicts[query_id] = (
                    bool(judgement.correct) if judgement.status == "judged" else None
                )
        self.stop_requested = False
        self._decided = False
        if self._stop_path.exists():  # left by an earlier execution: this one is a resume
            self._stop_path.unlink()
            log(f"{store.run_dir}: a stop request of an earlier execution was cleared")
        self._dirty = True
        self._written_at = 0.0
        self._write_failed = False
        self._closed = threading.Event()
        self._ended = False
        self._thread: threading.Thread | None = None
        #: The report's interval, set for the last write (`final_status`).
        self._final_ci: tuple[float, float] | None = None
        try:  # before any work: a status that cannot be written is said now
            self._write()
        except OSError as e:
            raise RunStoreError(
                f"cannot write {self.path} ({e.strerror}): the run's live status could not be "
                "kept; fix the run directory's permissions or choose another --run-dir. "
                "Nothing was run."
            ) from None

    # --------------------------------------------------------------- the store's events

    def recorded(self, record: QueryRecord) -> None:
        """The store wrote `record` (`RunStore.append`)."""
        if record.query_id not in self._wanted:
            return
        with self._lock:
            self._count(record)
            self.status.ran_now += 1
            # Its query is no longer in flight: until the engine's next look, no write counts
            # it both recorded and running (the gauge may read low for that step, never high).
            self.status.running = max(0, self.status.running - 1)
            if self._began is None:  # it ran between two looks of the engine's gauges
                self._began = self._created
            self._dirty = True

    def judged(self, judgement: Judgement) -> None:
        """The store wrote `judgement` (`RunStore.append_judgement`)."""
        if judgement.judge_model != self._judge or judgement.query_id not in self._wanted:
            return
        with self._lock:
            if self._verdicts.get(judgement.query_id) is not None:
                return  # the first verdict counts (`RunStore.judgements`)
            ok = judgement.status == "judged"
            self._verdicts[judgement.query_id] = bool(judgement.correct) if ok else None
            self._dirty = True

    def _count(self, record: QueryRecord) -> None:
        self._recorded.add(record.query_id)
        status = self.status
        if record.termination == STOPPED:
            status.cut_by_stop += 1
        status.recorded[record.status] = status.recorded.get(record.status, 0) + 1
        self._usage = self._usage + record.usage
        classes = Counter(retry_class(r) for turn in record.trajectory for r in turn.retries)
        for kind, n in classes.items():
            status.retries[kind] = status.retries.get(kind, 0) + n
        if self._price is not None:
            status.cost_usd = (status.cost_usd or 0.0) + self._price.cost(record.usage)
            status.cost_estimated_usd = (
                status.cost_estimated_usd or 0.0
            ) + self._price.estimated_cost(record.usage)

    @property
    def incomplete(self) -> bool:
        """Queries of the slice have no record, or one cut by a stop (a resume runs them)."""
        with self._lock:
            return len(self._recorded) < self.status.queries or self.status.cut_by_stop > 0

    # --------------------------------------------------------------- the engine's gauges

    def live(
        self,
        running: int | None = None,
        waiting: int | None = None,
        replicas: dict[str, int] | None = None,
    ) -> None:
        """What the engine sees now: queries in flight, calls waiting on the limiter, replicas
        by node (None: unchanged)."""
        with self._lock:
            before = (self.status.running, self.status.waiting_on_limiter, self.status.replicas)
            if running is not None:
                self.status.running = running
                if running and self._began is None:
                    self._began = time.monotonic()
            if waiting is not None:
                self.status.waiting_on_limiter = waiting
            if replicas is not None:
                self.status.replicas = dict(replicas)
            now = (self.status.running, self.status.waiting_on_limiter, self.status.replicas)
            self._dirty = self._dirty or now != before

    def decided(self, reason: str) -> None:
        """The run's comparison is decided (`stop_when_decided`): it starts no new query."""
        with self._lock:
            if not self._decided:
                self._decided, self.status.stopped, self._dirty = True, reason, True

    # --------------------------------------------------------------- writing

    def _snapshot(self) -> RunStatus:
        status = self.status
        verdicts = [v for v in self._verdicts.values() if v is not None]
        per_minute = self._pace() if status.state == "running" else status.queries_per_minute
        left = max(0, status.queries - len(self._recorded))
        live = status.state == "running" and not self.stop_requested and not self._decided
        eta = left / per_minute * 60 if per_minute and live else (0.0 if not left else None)
        # A stopped (or decided) run whose last query in flight ended is stopped, while a
        # sweep's other runs go on in the same driver.
        state = status.state
        if state == "running" and not status.running:
            state = "stopped" if self.stop_requested else "decided" if self._decided else state
        return status.model_copy(
            update={
                "state": state,
                "updated_at": now_iso(),
                "tokens": self._usage.model_dump(),
                "cost_usd": None if status.cost_usd is None else round(status.cost_usd, 6),
                "cost_estimated_usd": None
                if status.cost_estimated_usd is None
                else round(status.cost_estimated_usd, 6),
                "judged": len(verdicts),
                "correct": sum(verdicts),
                "judge_failed": len(self._verdicts) - len(verdicts),
                "accuracy_judged": round(sum(verdicts) / len(verdicts), 4) if verdicts else None,
                "accuracy_ci95": self._final_ci or wilson(sum(verdicts), len(verdicts)),
                "queries_per_minute": None if per_minute is None else round(per_minute, 2),
                "eta_seconds": None if eta is None else round(eta, 1),
            },
            deep=True,
        )

    def _pace(self) -> float | None:
        """Queries recorded per minute by this execution since its first query ran."""
        if self._began is None:
            return None
        elapsed = time.monotonic() - self._began
        return self.status.ran_now / elapsed * 60 if self.status.ran_now and elapsed > 0 else None

    def _write(self) -> None:
        with self._lock:
            snapshot = self._snapshot()
            self._dirty = False
        write_report_file(self.path, snapshot.model_dump_json(indent=1))
        self._written_at = time.monotonic()

    def _tick(self) -> None:
        if not self.stop_requested and self._stop_path.exists():
            self.stop_requested = True
            with self._lock:
                self.status.stopped = STOP_REASON
                self._dirty = True
            self._log(
                f"{self.status.run_dir}: stop requested: no new query starts and the "
                f"{self.status.running} in flight end as retryable (resume runs them)"
            )
        every = self.status.every_seconds
        since = time.monotonic() - self._written_at
        if (self._dirty and since >= every) or since >= heartbeat_seconds(every):
            try:
                self._write()
            except OSError as e:  # the run goes on: its records are what counts
                if not self._write_failed:
                    self._write_failed = True
                    self._log(f"warning: cannot rewrite {self.path} ({e.strerror}); it goes on")

    def start(self) -> StatusBoard:
        """Rewrite the file every `every_seconds` while anything changed (and at the heartbeat
        while nothing does), on a daemon thread."""

        def loop() -> None:
            while not self._closed.wait(POLL_SECONDS):
                self._tick()

        self._thread = threading.Thread(target=loop, name="status-board", daemon=True)
        self._thread.start()
        return self

    def close(
        self,
        state: State,
        stopped: str | None = None,
        accuracy_ci95: tuple[float, float] | None = None,
    ) -> None:
        """The execution ended in `state` (why it stopped early, if it did): the last write,
        with `accuracy_ci95` instead of the live interval when given (the report's). A stop
        request it honoured is done with: its file goes. Only the first call counts."""
        if self._ended:
            return
        self._ended = True
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.status.state == "running":
                pace = self._pace()
                self.status.queries_per_minute = None if pace is None else round(pace, 2)
            self.status.state = state
            self.status.running = 0
            self.status.waiting_on_limiter = 0
            self.status.stopped = stopped or self.status.stopped
            self._final_ci = accuracy_ci95
        if self.stop_requested:
            self._stop_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._write()


def final_status(
    store: RunStore,
    config: RunConfig,
    price: Price | None,
    wanted: set[str],
    accuracy_ci95: tuple[float, float] | None,
    log: Log,
) -> RunStatus:
    """The status written with the reports, from the run's files (`pipeline.reduce`): the same
    counts as the report, its bootstrap interval, and `finished` unless the last execution was
    stopped or interrupted before its slice was done (its own figures are kept)."""
    before = read_status(store.run_dir)
    state: State = "finished"
    board = StatusBoard(store, config, price, wanted, 0, log, every=1.0, state=state)
    if before is not None:
        previous = before.status
        if board.incomplete and previous.state in ("stopped", "decided", "interrupted"):
            state = previous.state
        kept = ("started_at", "todo_at_start", "ran_now", "replicas", "stopped", "every_seconds")
        for name in (*kept, "queries_per_minute"):
            setattr(board.status, name, getattr(previous, name))
    board.close(state, accuracy_ci95=accuracy_ci95)
    return board.status
