"""The Ray runtime: searcher replicas, cluster-wide limiters and the driver-side scheduler.

Nothing below this package imports Ray; everything here is a thin shell around the plain
modules (tools, agent, llm, store), so those stay testable without a cluster. The runtime never
imports the pipeline: the pipeline hands it `PreparedRun`s (`engines/contract.py`). The modules
behind `RayEngine` load on first use: every Ray worker process imports this package, and the driver
starts Ray before it imports them (seconds).
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from piserini_ray.endpoints import ModelEndpoints, StopServers
from piserini_ray.engines.ray.background import on_thread

if TYPE_CHECKING:
    from piserini_ray.config import ModelConfig, RunConfig
    from piserini_ray.data import Query
    from piserini_ray.engines.contract import PreparedRun
    from piserini_ray.engines.ray.replicas import Replicas
    from piserini_ray.records import QueryRecord
    from piserini_ray.store import RunStore


def ensure_ray(config: RunConfig, log: Callable[[str], None]) -> None:
    """Join the configured cluster or start a local Ray, if this process has none yet."""
    from piserini_ray.engines.ray.ray_env import cluster_address, prepare_local_ray

    if cluster_address(config.runtime) is None:
        prepare_local_ray()  # before Ray is imported
    from piserini_ray.engines.ray.ray_env import start_ray

    start_ray(config.runtime, log)


class RayEngine:
    """The Ray engine: searcher replicas on the configured cluster (or a local Ray), fed by the
    driver's scheduler (`engines/ray/scheduler.py`); judging from the driver under the judge's
    cluster-wide limiter (`engines/ray/judging.py`).

    `start` brings Ray and the replicas up on a background thread while `prepare` checks the
    data (a local Ray and a replica take seconds each to boot); `run` waits for them. With
    `release_ray`, `close` lets Ray go in the background if this process started it (a
    command's last step: the reports are written meanwhile, and the process waits for it at
    exit); without it, Ray stays up for the next engine of the process."""

    #: Each replica checks its run's hosted model from its node before any query
    #: (`Dispatcher.model_checks`): a check from the driver too would only repeat the head's.
    checks_agent_models = True

    def __init__(self, release_ray: bool = False) -> None:
        self._bring_up: Future[Replicas] | None = None
        #: Where a served judge's servers go: on the cluster, placed by their resources.
        self.endpoints = ModelEndpoints(place=self._place)
        self.release_ray = release_ray
        self._log: Callable[[str], None] = print

    def _place(self, model: ModelConfig) -> tuple[str, StopServers]:
        from piserini_ray.engines.ray.model_servers import place_on_cluster

        return place_on_cluster(model, self._log)

    def start(self, configs: list[RunConfig], log: Callable[[str], None]) -> None:
        self._log = log
        if self._bring_up is not None:
            return
        from piserini_ray.engines.ray.ray_env import start_ray_async

        start_ray_async(configs[0].runtime, log)  # Ray boots while the modules below load
        # Loaded on this thread, before the bring-up thread starts: two threads importing the
        # package's modules at once (`prepare` the tools, the bring-up the searcher) can meet a
        # module another thread has only begun to import (importlib's KeyError, seen).
        from piserini_ray.engines.ray.replicas import bring_up

        self._bring_up = on_thread(lambda: bring_up(configs, log), "bring-up")

    def run(self, runs: list[PreparedRun], log: Callable[[str], None]) -> None:
        from piserini_ray.engines.ray.scheduler import run_prepared

        early, self._bring_up = self._bring_up, None
        run_prepared(runs, self.endpoints, log, early)

    def judge(
        self,
        config: RunConfig,
        store: RunStore,
        records: list[QueryRecord],
        queries: dict[str, Query],
        log: Callable[[str], None],
    ) -> None:
        ensure_ray(config, log)
        from piserini_ray.engines.ray.judging import judge_on_ray

        self._log = log
        api_base = self.endpoints.api_base(config.judge_model(), config.offline, store)
        judge_on_ray(config, store, records, queries, api_base, log)

    def close(self) -> None:
        """Stop what `start` brought up when `run` never took it (`prepare` failed, Ctrl-C),
        the offline providers, and Ray if this process started it."""
        early, self._bring_up = self._bring_up, None
        if early is not None:
            # Let Ray finish starting (it is shut down whole); its error is not the one reported.
            with contextlib.suppress(BaseException):
                early.result().close()
        self.endpoints.close()
        if self.release_ray:
            from piserini_ray.engines.ray.ray_env import release_ray_async

            released = release_ray_async()
            if released is not None:
                atexit.register(released.join)
