"""Judging beside the queries: on the Ray engine, when the job judges next (`run`, not a pilot
or `run_on_ray`), each answer is judged as soon as its record is written, while the other
queries still run, so the judging no longer starts after the last query.

The driver's thread only hands each record over (`submit`: no import, no call); one thread of
its own, started once the replicas are up (not at the first answer, in the queries' busiest
seconds; not before, where on a small machine it slows the replicas' start), imports the
judge (litellm: seconds of CPU) and runs an asyncio loop with `judge.concurrency` calls at
once per judge, through the same client, limiter and endpoint as the judging after the run
(`judging.judge_client`), and writes each verdict into the run's store as it comes. What it
has not judged when the queries end (a judge that failed, a call cut by Ctrl-C, a batch-tier
judge, which is never judged here) the judging after the run does: it judges every answer
without a verdict, so nothing is judged twice or left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
from collections.abc import Callable
from typing import Any

from piserini_ray.config import RunConfig
from piserini_ray.data import Query
from piserini_ray.endpoints import ModelEndpoints
from piserini_ray.engines.contract import PreparedRun
from piserini_ray.records import QueryRecord
from piserini_ray.store import RunStore

#: What the judging needs (the judge, litellm), imported on this module's own thread.
JUDGE_MODULE = "piserini_ray.engines.ray.judging"

#: A record handed over: the run's judges (one config each), its store, the query, the record.
_Item = tuple[list[RunConfig], RunStore, Query, QueryRecord]


class JudgeAlongside:
    """Verdicts for the runs' answers as they come (see the module's docstring)."""

    def __init__(
        self, runs: list[PreparedRun], endpoints: ModelEndpoints, log: Callable[[str], None]
    ) -> None:
        #: Each run's judges that judge here, by run directory (a batch-tier judge waits for
        #: the whole run: its Batch API call takes every answer at once).
        self.judges: dict[str, list[RunConfig]] = {}
        for plan in runs:
            judges = [
                plan.config.judged_by(model)
                for model in plan.config.judge_panel()
                if model.service_tier != "batch"
            ]
            if plan.judge_as_they_come and judges:
                self.judges[str(plan.run_dir)] = judges
        self.endpoints = endpoints
        self.log = log
        self.judged = 0
        #: Set once the judge's modules are imported (or failed to): the reports' modules load
        #: after it, on another thread (two threads importing the package at once can fail).
        self.imported = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[_Item] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False
        self._cancel = False
        self._broken: str | None = None
        self._thread = threading.Thread(target=self._main, name="judge-alongside", daemon=True)
        if self.judges:
            names = sorted({j.judge_model().name for js in self.judges.values() for j in js})
            log(f"each answer is judged as it comes, by {', '.join(names)}")
            self._thread.start()  # now: see the module's docstring for when it is made
        else:
            self.imported.set()

    def submit(self, plan: PreparedRun, query: Query, record: QueryRecord) -> None:
        """Hand over a record just written (from the driver's thread: never blocks)."""
        judges = self.judges.get(str(plan.run_dir))
        if not judges:
            return
        with self._lock:
            self._pending.append((judges, plan.store, query, record))
            loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop ended: the judging after does it
                loop.call_soon_threadsafe(wake.set)

    def close(self, cancel: bool = False) -> None:
        """Wait for every verdict handed over (`cancel`: drop the calls in flight; their
        answers are judged after the run), then end the thread."""
        if not self.judges:
            return
        with self._lock:
            self._closing, self._cancel = True, cancel
            loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)
        self._thread.join()
        if self._broken is not None:
            self.log(
                f"judging as the answers came stopped ({self._broken}); the rest is judged now"
            )
        elif self.judged:
            self.log(f"{self.judged} answers judged while the queries ran")

    def _main(self) -> None:
        try:
            importlib.import_module(JUDGE_MODULE)
        except Exception as exc:  # the judging after the run raises it where it is used
            self._broken = f"{type(exc).__name__}: {exc}"
            return
        finally:
            self.imported.set()
        try:
            asyncio.run(self._serve())
        except Exception as exc:  # never the run's failure: its answers are judged after it
            self._broken = f"{type(exc).__name__}: {exc}"

    async def _serve(self) -> None:
        from piserini_ray.engines.ray.judging import judge_client
        from piserini_ray.judging.grader import judge_one

        wake = asyncio.Event()
        with self._lock:
            self._loop, self._wake = asyncio.get_running_loop(), wake
        #: Each (run, judge)'s client and the gate that holds it to `judge.concurrency`.
        clients: dict[tuple[int, str], tuple[Any, asyncio.Semaphore]] = {}
        tasks: set[asyncio.Task[None]] = set()

        async def one(
            judged: RunConfig, store: RunStore, query: Query, record: QueryRecord
        ) -> None:
            key = (id(store), judged.judge_model().name)
            if key not in clients:
                api_base = self.endpoints.api_base(judged.judge_model(), judged.offline, store)
                client = judge_client(judged, api_base)  # the judging after the run's
                clients[key] = (client, asyncio.Semaphore(judged.judge.concurrency))
            client, gate = clients[key]
            async with gate:
                verdict = await judge_one(
                    client, query, record, judged.judge.max_parse_retries, judged.judge.template
                )
            store.append_judgement(verdict)
            self.judged += 1

        async def guarded(*item: Any) -> None:
            try:
                await one(*item)
            except Exception as exc:  # left to the judging after the run, which says why
                self._broken = self._broken or f"{type(exc).__name__}: {exc}"

        while True:
            wake.clear()  # before taking the pending ones: a record handed over after sets it
            with self._lock:
                items, self._pending = self._pending, []
                closing, cancel = self._closing, self._cancel
            if cancel:
                break
            for judges, store, query, record in items:
                for judged in judges:
                    task = asyncio.create_task(guarded(judged, store, query, record))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if closing:  # everything handed over is taken: nothing more comes
                break
            await wake.wait()
        if cancel:
            for task in tasks:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
