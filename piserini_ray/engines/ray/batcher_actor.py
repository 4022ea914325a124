"""The cluster-wide batcher of a run's agent turns on Ray (`model.service_tier: batch`): one
actor per run, on the driver's node (its ledger is in the run directory there, and it reaches
the provider as the driver does), that every replica's client hands its turns to
(`llm/batcher.TurnBatcher` does the gathering, sending, polling and resuming)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from pydantic import SecretStr
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from piserini_ray.config import RunConfig
from piserini_ray.llm.batcher import TurnBatcher
from piserini_ray.llm.batches import batches_for
from piserini_ray.llm.scrubber import hold
from piserini_ray.store import TurnLedger

#: Turns one batcher holds at once: every query in flight on every replica waits in it.
MAX_WAITING = 100_000


@ray.remote(num_cpus=0)
class BatcherActor:
    """Created without its key: Ray keeps an actor's creation arguments in the GCS (and in
    Redis when GCS fault tolerance is on) for as long as the cluster lives. The key comes by
    a method call (`unlock`), whose arguments live in this process's memory only."""

    def __init__(
        self,
        provider: str,
        api_base: str | None,
        cache: bool,
        ledger: str,
        gather_seconds: float,
        poll_seconds: float,
        max_rounds: int,
    ) -> None:
        self._settings = (provider, api_base, cache)
        self._ledger = ledger
        self._timing = (gather_seconds, poll_seconds, max_rounds)
        self._batcher: TurnBatcher | None = None

    def unlock(self, key: SecretStr | None) -> None:
        """Hand the key the batches are sent with (None: an endpoint that needs none)."""
        provider, api_base, cache = self._settings
        secret = key.get_secret_value() if key is not None else None
        hold(secret)  # scrubbed from everything this actor's process writes or prints
        api = batches_for(provider, api_base, secret, cache)
        self._batcher = TurnBatcher(api, TurnLedger(Path(self._ledger)), *self._timing, print)

    def _unlocked(self) -> TurnBatcher:
        if self._batcher is None:
            raise RuntimeError("the batcher actor was not handed its key (unlock) before use")
        return self._batcher

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._unlocked().complete(body)

    def batches_sent(self) -> int:
        return self._unlocked().batches_sent


def start_batcher(
    name: str,
    config: RunConfig,
    run_dir: Path,
    provider: str,
    api_base: str | None,
    key: SecretStr | None,
) -> Any:
    """The run's batcher actor, named `name`, pinned to this (the driver's) node, unlocked
    with `key` by a method call (never a creation argument)."""
    settings = config.runtime.batch
    here = ray.get_runtime_context().get_node_id()
    actor = BatcherActor.options(  # type: ignore[attr-defined]
        name=name,
        max_concurrency=MAX_WAITING,
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
    ).remote(
        provider,
        api_base,
        config.model.prompt_caching == "auto",
        str(run_dir / "agent_batches.jsonl"),
        settings.gather_seconds,
        settings.poll_seconds,
        config.retry.max_attempts,
    )
    ray.get(actor.unlock.remote(key))
    ray.get(actor.batches_sent.remote())  # up before any turn is handed to it
    return actor


class RayBatcher:
    """A replica client's `Batcher`: the run's batcher actor, found by name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._actor: Any = None

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._actor is None:
            self._actor = ray.get_actor(self.name)
        try:
            return await self._actor.complete.remote(body)
        except ray.exceptions.RayTaskError as error:
            raise error.as_instanceof_cause() from None
