"""The Ray runtime: searcher replicas, cluster-wide limiters and the driver-side scheduler.

Nothing below this package imports Ray; everything here is a thin shell around the plain
modules (tools, agent, llm, store), so those stay testable without a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from piserini_ray.config import RunConfig
from piserini_ray.pipeline import PreparedRun, RunSummary, execute


def ensure_ray(config: RunConfig, log: Callable[[str], None]) -> None:
    """Join the configured cluster or start a local Ray, if this process has none yet."""
    from piserini_ray.runtime.ray_env import cluster_address, prepare_local_ray

    if cluster_address(config.runtime) is None:
        prepare_local_ray()  # before Ray is imported
    from piserini_ray.runtime.ray_env import start_ray

    start_ray(config.runtime, log)


class RayEngine:
    """The Ray engine: searcher replicas on the configured cluster (or a local Ray), fed by the
    driver's scheduler (`runtime/scheduler.py`)."""

    def run(self, runs: list[PreparedRun], log: Callable[[str], None]) -> None:
        from piserini_ray.runtime.ray_env import cluster_address, prepare_local_ray

        if cluster_address(runs[0].config.runtime) is None:
            prepare_local_ray()  # before Ray is imported
        from piserini_ray.runtime.scheduler import run_prepared

        run_prepared(runs, log)


def run_on_ray(
    configs: list[tuple[RunConfig, Path | None]],
    log: Callable[[str], None],
    only: set[str] | None = None,
) -> list[RunSummary]:
    """Run (or resume) one or more runs concurrently on one Ray cluster (`only`: just those
    queries of their slices); one summary each."""
    return execute(configs, RayEngine(), log, only)
