"""The Ray runtime: searcher replicas, cluster-wide limiters and the driver-side scheduler.

Nothing below this package imports Ray; everything here is a thin shell around the plain
modules (tools, agent, llm, store), so those stay testable without a cluster. This module
imports the pipeline only when called: every Ray worker process imports the package, and the
pipeline's reports (matplotlib, SciPy) and model checks (litellm) would cost each of them
seconds of start-up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piserini_ray.config import RunConfig
    from piserini_ray.pipeline import PreparedRun, RunSummary
    from piserini_ray.runtime.scheduler import Replicas


def ensure_ray(config: RunConfig, log: Callable[[str], None]) -> None:
    """Join the configured cluster or start a local Ray, if this process has none yet."""
    from piserini_ray.runtime.ray_env import cluster_address, prepare_local_ray

    if cluster_address(config.runtime) is None:
        prepare_local_ray()  # before Ray is imported
    from piserini_ray.runtime.ray_env import start_ray

    start_ray(config.runtime, log)


class RayEngine:
    """The Ray engine: searcher replicas on the configured cluster (or a local Ray), fed by the
    driver's scheduler (`runtime/scheduler.py`).

    `start` brings Ray and the replicas up on a background thread while `prepare` checks the
    data (a local Ray and a replica take seconds each to boot); `run` waits for them."""

    def __init__(self) -> None:
        self._bring_up: Future[Replicas] | None = None

    def start(self, configs: list[RunConfig], log: Callable[[str], None]) -> None:
        if self._bring_up is not None:
            return
        from piserini_ray.runtime.ray_env import start_ray_async

        start_ray_async(configs[0].runtime, log)  # Ray boots while the modules below load
        self._bring_up = Future()
        threading.Thread(
            target=_bring_up, args=(self._bring_up, configs, log), name="bring-up", daemon=True
        ).start()

    def run(self, runs: list[PreparedRun], log: Callable[[str], None]) -> None:
        from piserini_ray.runtime.scheduler import run_prepared

        early, self._bring_up = self._bring_up, None
        run_prepared(runs, log, early)

    def close(self) -> None:
        """Stop what `start` brought up when `run` never took it (`prepare` failed, Ctrl-C)."""
        early, self._bring_up = self._bring_up, None
        if early is None:
            return
        try:
            replicas = early.result()  # let Ray finish starting: it is shut down whole at exit
        except BaseException:  # its error is not the one being reported
            return
        replicas.close()


def _bring_up(
    future: Future[Replicas], configs: list[RunConfig], log: Callable[[str], None]
) -> None:
    try:
        from piserini_ray.runtime.scheduler import bring_up

        future.set_result(bring_up(configs, log))
    except BaseException as exc:  # handed to whoever waits
        future.set_exception(exc)


def run_on_ray(
    configs: list[tuple[RunConfig, Path | None]],
    log: Callable[[str], None],
    only: set[str] | None = None,
) -> list[RunSummary]:
    """Run (or resume) one or more runs concurrently on one Ray cluster (`only`: just those
    queries of their slices); one summary each."""
    from piserini_ray.preflight import preflight_runs

    # The checks `prepare` begins with, made here instead: a config mistake stops before Ray
    # starts, and Ray then starts before the pipeline's imports (seconds).
    priced = preflight_runs([config for config, _ in configs])
    engine = RayEngine()
    engine.start([config for config, _ in configs], log)
    from piserini_ray.pipeline import execute

    return execute(configs, engine, log, only, priced)
