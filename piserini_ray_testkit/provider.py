"""The emulated provider: the product's offline provider (`piserini_ray.offline.OfflineProvider`)
with what only tests need, added through its extension point (`piserini_ray.offline.hooks`).

- **seeded faults** (`FaultRates`): each admitted request that no script covers draws, from a
  RNG seeded by `OfflineConfig.seed`, whether it gets a server error, a hang, or a damaged
  reply (every such request draws the same number of values whatever fires, so a seed
  reproduces the same pattern over the same sequence of requests);
- **scripted behaviours** (`EmulatedProvider.script`): one-shot failures or delays for the next
  request (of a model, or any), taken before the quota windows, which they bypass;
- **a gate** (`hold`, `release`, `wait_held`): requests held unanswered while a test kills a
  process, waited on as an event rather than a clock;
- **batch fates** (`BatchFates`): requests of a batch ending errored or expired;
- `reset`: the request log, the bill, the caches and windows cleared, the RNGs reseeded.

    with EmulatedProvider(OfflineConfig(seed=7), faults=FaultRates(http_500=0.5)) as p:
        ...  # point a run's `model.api_base` at p.base_url
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from piserini_ray.config.offline import OfflineConfig
from piserini_ray.offline.batch_emulator import Fate
from piserini_ray.offline.bill import RecordedRequest
from piserini_ray.offline.codec import Codec, Parsed
from piserini_ray.offline.hooks import PLAIN, Interceptor, Ticket
from piserini_ray.offline.policy import Policy, PolicyReply
from piserini_ray.offline.server import OfflineProvider
from piserini_ray_testkit.faults import (
    FAULT_ORDER,
    SERVER_ERROR_STATUSES,
    apply_reply_fault,
    scripted_problem,
    seeded_server_error,
)
from piserini_ray_testkit.settings import REPLY_FAULTS, BatchFates, FaultRates, Scripted

__all__ = ["EmulatedProvider", "Emulation"]


class _Damaging(Ticket):
    """A request whose reply may be damaged by the first of `faults` that applies (a fault
    needing a tool call applies to none without one); the record names the fault applied."""

    def __init__(self, faults: list[str] | None = None) -> None:
        self.faults = faults or []

    def damage(
        self, reply: PolicyReply, shown: Mapping[str, Any], record: RecordedRequest
    ) -> PolicyReply:
        for kind in self.faults:
            reply, applied = apply_reply_fault(reply, kind, shown.get("tools"))
            if applied:
                record.fault = kind
                return reply
        return reply


class _Seeded(_Damaging):
    """An unscripted request: after the latency, the seeded draws (a server error raised, a
    hang waited out with no reply fault after it, or reply faults to apply)."""

    def __init__(self, emulation: Emulation) -> None:
        super().__init__()
        self.emulation = emulation

    async def fault(self, record: RecordedRequest) -> None:
        fired, status = self.emulation.draw_faults()
        if "http_500" in fired:
            record.fault = "http_500"
            raise seeded_server_error(status)
        if "hang" in fired:
            record.fault = "hang"
            record.delayed += self.emulation.hang_seconds
            await asyncio.sleep(self.emulation.hang_seconds)
            return
        self.faults = [kind for kind in fired if kind in REPLY_FAULTS]


class _ScriptedTicket(_Damaging):
    """A request a scripted behaviour covers: past the quota windows, delayed, its reply
    damaged or its usage dropped as the script says."""

    bypasses_quota = True

    def __init__(self, spec: Scripted, hang_seconds: float) -> None:
        super().__init__([spec.kind] if spec.kind in REPLY_FAULTS else [])
        self.spec = spec
        self.hang_seconds = hang_seconds

    async def delay(self, record: RecordedRequest) -> None:
        if self.spec.kind in ("hang", "latency"):
            seconds = self.hang_seconds if self.spec.seconds is None else self.spec.seconds
            record.delayed += seconds
            await asyncio.sleep(seconds)

    def damage(
        self, reply: PolicyReply, shown: Mapping[str, Any], record: RecordedRequest
    ) -> PolicyReply:
        damaged = super().damage(reply, shown, record)
        if damaged is reply and self.faults:
            record.fault = None  # scripted, but the reply had no tool call to damage
        return damaged

    def encoded(self, codec: Codec, body: dict[str, Any]) -> None:
        if self.spec.kind == "no_usage":
            codec.drop_usage(body)


class Emulation(Interceptor):
    """The test hooks of `EmulatedProvider`, as the offline provider's interceptor."""

    def __init__(
        self, seed: int, faults: FaultRates, batch_fates: BatchFates, hang_seconds: float
    ) -> None:
        self.seed = seed
        self.faults = faults
        self.batch_fate_rates = batch_fates
        self.hang_seconds = hang_seconds
        self.lock = threading.Lock()  # guards the script, the gate and the RNGs
        self.script: deque[Scripted] = deque()
        #: `hold`: requests still answered before the gate closes (None: open), the gate held
        #: requests wait on, and how many wait.
        self.answered_before_hold: int | None = None
        self.gate_event = asyncio.Event()
        self.held = 0
        self.held_changed = threading.Condition(self.lock)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.script.clear()
            self.fault_rng = random.Random(f"{self.seed}:faults")
            self.batch_rng = random.Random(f"{self.seed}:batches")

    async def gate(self) -> None:
        """Past the requests still answered, wait for `release`."""
        with self.lock:
            if self.answered_before_hold is None:
                return
            if self.answered_before_hold > 0:
                self.answered_before_hold -= 1
                return
            gate = self.gate_event
            self.held += 1
            self.held_changed.notify_all()
        try:
            await gate.wait()
        finally:
            with self.lock:
                self.held -= 1
                self.held_changed.notify_all()

    def ticket(self, parsed: Parsed, record: RecordedRequest) -> Ticket:
        """The next scripted behaviour meant for this model (a scripted failure is raised
        here), or the seeded faults' ticket (a plain one when no rate is set)."""
        spec = self._next_scripted(parsed.model)
        if spec is None:
            return _Seeded(self) if any(self.faults.model_dump().values()) else PLAIN
        record.scripted, record.fault = True, spec.kind
        problem = scripted_problem(spec, lambda: parsed.prompt_tokens)
        if problem is not None:
            record.retry_after = problem.retry_after
            raise problem
        return _ScriptedTicket(spec, self.hang_seconds)

    def _next_scripted(self, model: str) -> Scripted | None:
        """Pop the first queued behaviour meant for this model (or for any model)."""
        with self.lock:
            for i, spec in enumerate(self.script):
                if spec.model is None or spec.model == model:
                    del self.script[i]
                    return spec
        return None

    def draw_faults(self) -> tuple[list[str], int]:
        """Which random faults fire for this request, and the status a server error would use
        (the same number of draws whatever fires)."""
        with self.lock:
            draws = {kind: self.fault_rng.random() for kind in FAULT_ORDER}
            status = self.fault_rng.choice(SERVER_ERROR_STATUSES)
        fired = [kind for kind in FAULT_ORDER if draws[kind] < getattr(self.faults, kind)]
        return fired, status

    def batch_fates(self, n: int) -> list[Fate]:
        """Each request's fate, drawn in order when the batch is created (one draw each)."""
        rates = self.batch_fate_rates
        fates: list[Fate] = []
        with self.lock:
            for _ in range(n):
                draw = self.batch_rng.random()
                if draw < rates.expire_rate:
                    fates.append("expired")
                elif draw < rates.expire_rate + rates.error_rate:
                    fates.append("errored")
                else:
                    fates.append("run")
        return fates


class EmulatedProvider(OfflineProvider):
    """The offline provider with seeded faults, scripted behaviours, a gate and batch fates
    (the module docstring); `hang_seconds`: how long a hang (seeded, or scripted without
    `seconds`) waits."""

    def __init__(
        self,
        config: OfflineConfig | None = None,
        policies: dict[str, Policy] | None = None,
        *,
        faults: FaultRates | None = None,
        batch_fates: BatchFates | None = None,
        hang_seconds: float = 3600.0,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        config = config or OfflineConfig()
        self.emulation = Emulation(
            config.seed, faults or FaultRates(), batch_fates or BatchFates(), hang_seconds
        )
        super().__init__(config, policies, host=host, port=port, interceptor=self.emulation)

    def script(self, *specs: Scripted) -> None:
        """Queue one-shot behaviours, consumed in order by the next matching requests."""
        with self.emulation.lock:
            self.emulation.script.extend(specs)

    def reset(self) -> None:
        """Clear the log, the bill, the script, the conversation caches and the quota windows,
        and reseed the RNGs."""
        self._app.reset()

    def hold(self, after: int = 0) -> None:
        """Answer the next `after` requests, then hold every later one, unanswered, until
        `release`: a test keeps a run in flight for as long as it needs (to kill a process
        mid-run), waiting on `wait_held` rather than on a clock."""
        with self.emulation.lock:
            self.emulation.answered_before_hold = after
            self.emulation.gate_event = asyncio.Event()

    def release(self) -> None:
        """Answer the held requests, and every later one."""
        with self.emulation.lock:
            self.emulation.answered_before_hold = None
            gate = self.emulation.gate_event
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the server has stopped
                self._loop.call_soon_threadsafe(gate.set)

    def wait_held(self, count: int = 1, timeout: float = 300.0) -> bool:
        """Until at least `count` requests are held (False if `timeout` passed first)."""
        emulation = self.emulation
        with emulation.held_changed:
            return emulation.held_changed.wait_for(lambda: emulation.held >= count, timeout)

    @property
    def held(self) -> int:
        with self.emulation.lock:
            return self.emulation.held
