"""Waiting for actors to come up, visibly and never forever.

Ray waits without end for an actor that asks for more than any node has (a GPU on a machine
without one): a run would sit there silently. So a demand that no alive node can meet is an
error before the wait (a warning on a cluster that an autoscaler may grow), a long wait says
what it waits for, and an actor whose constructor failed is a clean error naming the cause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from piserini_ray.engines.ray.ray_env import cluster_can_grow
from piserini_ray.errors import PiseriniRayError

#: How often a wait for actors that are not up yet says so.
PROGRESS_SECONDS = 15.0


class StartupError(PiseriniRayError):
    """Actors that a run needs cannot start."""


def _asked(demand: dict[str, float]) -> dict[str, float]:
    """The resources `demand` actually asks for (a GPU count of 0 asks for nothing)."""
    return {k: v for k, v in demand.items() if v > 0}


def alive_nodes() -> list[dict[str, Any]]:
    """`ray.nodes()` of the nodes alive now."""
    return [n for n in ray.nodes() if n.get("Alive")]


def nodes_that_fit(demand: dict[str, float]) -> list[str]:
    """Ids of the alive nodes with at least `demand` of each resource (free or not)."""
    wanted = _asked(demand)
    return [
        n["NodeID"]
        for n in alive_nodes()
        if all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in wanted.items())
    ]


def check_feasible(
    demand: dict[str, float], what: str, fix: str, log: Callable[[str], None]
) -> None:
    """Refuse `demand` (the resources of one actor of `what`) when no alive node has that much
    of each resource; `fix` says what to change. Where the cluster can grow, warn instead."""
    if nodes_that_fit(demand):
        return
    wanted = _asked(demand)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    largest = {k: max((node.get(k, 0.0) for node in nodes), default=0.0) for k in wanted}
    problem = (
        f"{what} need {describe(wanted)} each, and no node of the cluster has that much (the "
        f"most any node has: {describe(largest)})"
    )
    if not cluster_can_grow():
        raise StartupError(f"{problem}: {fix}")
    log(f"warning: {problem}; waiting for the cluster to add such a node (or {fix})")


def actors_that_fit(
    count: int, demand: dict[str, float], what: str, log: Callable[[str], None]
) -> int:
    """How many of `count` CPU-bound actors of `demand` each to start: all of them on a
    cluster that can grow; on a Ray that cannot, no more than its free resources hold at once
    (the others would wait forever, and the work given to them with them), at least one."""
    if cluster_can_grow():
        return count
    free = ray.available_resources()
    wanted = _asked(demand)
    fit = min((int(free.get(k, 0.0) // v) for k, v in wanted.items()), default=count)
    if fit >= count:
        return count
    fit = max(1, fit)
    log(
        f"{count} {what} of {describe(wanted)} each do not fit what this Ray has free "
        f"({describe(free)}): starting {fit}"
    )
    return fit


def wait_until_up(refs: Sequence[Any], what: str, log: Callable[[str], None]) -> list[Any]:
    """The results of the readiness calls `refs` of some actors, in order. Every
    `PROGRESS_SECONDS` without all of them, says how many are still starting. A constructor
    that raised is a `StartupError` naming its error."""
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=PROGRESS_SECONDS)
        if pending:
            log(
                f"waiting for {len(pending)} of {len(refs)} {what} to start (free now: "
                f"{describe(ray.available_resources())})"
            )
    try:
        return ray.get(list(refs))
    except RayActorError as exc:
        raise StartupError(f"{what} could not start: {_cause(exc)}") from None


def started(ref: Any, what: str) -> Any:
    """The result of one actor's readiness call `ref` (done): a constructor that raised, or a
    readiness call that raised (a start-up step it awaits failed), is a `StartupError` naming
    its error."""
    try:
        return ray.get(ref)
    except (RayActorError, RayTaskError) as exc:
        raise StartupError(f"{what} could not start: {_cause(exc)}") from None


def _cause(exc: RayActorError | RayTaskError) -> str:
    text = str(getattr(exc, "cause", None) or exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def describe(resources: dict[str, float]) -> str:
    """Resources as `CPU 2, GPU 0` (no node markers, no memory)."""
    shown = sorted(
        (k, v)
        for k, v in resources.items()
        if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    )
    return ", ".join(f"{k} {v:g}" for k, v in shown) or "none"
