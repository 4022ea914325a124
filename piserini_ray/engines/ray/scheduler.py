"""The driver: fan a run's queries (or a sweep's runs) out to searcher replicas on Ray.

- **Backpressure**: at most `replicas x max_concurrency` queries in flight per replica group;
  the rest wait in the driver's queue, so a 100K-query run costs no object-store memory.
- **Recorded once**: the driver is the only writer; each finished record goes to its run store
  as it arrives (`ray.wait`), and the store refuses a second record for a query.
- **Infrastructure is not the query's fault**: a query whose actor or node died is re-submitted
  (Ray restarts the actor, up to `max_restarts`) and only after `max_infrastructure_attempts`
  is it recorded as failed. A query's own `failed` / `timeout` is its result.
- **Ctrl-C**: in-flight queries are abandoned (nothing half-written: records are whole lines),
  and the next run or `resume` re-runs exactly them.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from piserini_ray.engines.contract import PreparedRun, charge_served
from piserini_ray.engines.ray.dispatcher import Dispatcher
from piserini_ray.engines.ray.judge_alongside import JudgeAlongside
from piserini_ray.engines.ray.model_servers import ServedModels
from piserini_ray.engines.ray.ray_env import start_ray
from piserini_ray.engines.ray.replicas import Replicas, group_key
from piserini_ray.serving import served_key

if TYPE_CHECKING:
    from piserini_ray.endpoints import ModelEndpoints


#: What the driver needs after the last query, loaded while it only waits on the replicas: the
#: reports' modules (SciPy and matplotlib, 1.5 s between the last query and the report). The
#: judge's come with the judging beside the queries (`judge_alongside.py`).
AFTER_THE_QUERIES = ("piserini_ray.reports",)


def run_prepared(
    runs: list[PreparedRun],
    endpoints: ModelEndpoints,
    log: Callable[[str], None],
    early: Future[Replicas] | None = None,
) -> None:
    """Run every prepared run's todo list to completion (or Ctrl-C) on Ray. `early`: the
    `bring_up` begun before `prepare`."""
    todo = [run for run in runs if run.todo]
    replicas = early.result() if early is not None else None
    stack = contextlib.ExitStack()  # the model servers stop (and are charged) on the way out
    try:
        if not todo:
            return
        if replicas is None:
            start_ray(runs[0].config.runtime, log)
            replicas = Replicas([r.config for r in runs], log)
        replicas.add([r.config for r in todo], log, {group_key(r.config): r.index for r in todo})
        served = ServedModels([r.config.model for r in todo], log)
        stack.callback(_charge, todo, served)
        served.start()  # the model servers come up beside the replicas
        bases = {
            str(run.run_dir): None
            if served.serves(run.config.model)
            else endpoints.api_base(run.config.model, run.config.offline)
            for run in todo
        }
        dispatcher = Dispatcher(todo, bases, replicas, log, served)
        replicas.ready(log, dispatcher.model_checks)
        dispatcher.raise_check_failures()
        # The judge's imports, then the reports', load from now on: after the replicas' start
        # (on a small machine they would slow it), before most of the queries' work.
        dispatcher.alongside = alongside = JudgeAlongside(todo, endpoints, log)
        loading = _load_meanwhile(AFTER_THE_QUERIES, after=alongside.imported)
        interrupted = True
        try:
            dispatcher.start_batchers(after=loading)
            dispatcher.run()
            interrupted = False
        finally:
            alongside.close(cancel=interrupted)
            loading.join()  # no import of the driver's may meet it half-done
            dispatcher.stop_batchers()
    finally:
        try:
            stack.close()
        finally:
            if replicas is not None:
                replicas.close()


def _charge(runs: list[PreparedRun], served: ServedModels) -> None:
    """Stop the model servers and charge their hours to the runs they served."""
    for key, (seconds, count) in served.stop().items():
        charge_served([r for r in runs if served_key(r.config.model) == key], seconds, count)


def _load_meanwhile(
    modules: tuple[str, ...], after: threading.Event | None = None
) -> threading.Thread:
    """Import `modules` on a thread of their own, once `after` is set (another thread's
    imports are done). Started once the replicas are up: from then on the driver's own
    thread imports nothing they share (two threads importing the same package's modules at
    once have failed in importlib)."""

    def load() -> None:
        if after is not None:
            after.wait()
        for name in modules:
            with contextlib.suppress(Exception):  # a failed import is raised where it is used
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="load-reports", daemon=True)
    thread.start()
    return thread
