"""The per-query budget clock (docs/spec.md §4).

`charged` time is what the budget counts: in `working` mode, wall time minus the time spent
waiting on the rate limiter or sleeping in back-off; in `wall` mode, plain wall time. Waits are
entered through `waiting(...)` *before* they start, so the watchdog never mistakes a wait for
work, and every wait is kept in `waits` for the record.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Literal

from pydantic import BaseModel


class WaitRecord(BaseModel):
    at_charged: float
    expected: float | None
    seconds: float = 0.0
    why: str


class BudgetClock:
    def __init__(
        self,
        budget_seconds: float,
        steer_fraction: float = 0.7,
        mode: Literal["working", "wall"] = "working",
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget_seconds
        #: The steer comes at floor(0.7 T) of charged time.
        self.steer_at = float(math.floor(steer_fraction * budget_seconds))
        self.mode = mode
        self._now = now
        self.started = now()
        self._waited = 0.0
        self._wait_started: float | None = None
        self._depth = 0
        self.waits: list[WaitRecord] = []
        self.changed = asyncio.Event()

    def wall(self) -> float:
        return self._now() - self.started

    def waited(self) -> float:
        ongoing = self._now() - self._wait_started if self._wait_started is not None else 0.0
        return self._waited + ongoing

    def charged(self) -> float:
        return self.wall() if self.mode == "wall" else self.wall() - self.waited()

    def reading(self) -> tuple[float, float, float]:
        """`(charged, waited, wall)` at one instant, so that charged + waited == wall holds
        exactly in `working` mode (three separate reads drift apart on a busy machine)."""
        now = self._now()
        wall = now - self.started
        ongoing = now - self._wait_started if self._wait_started is not None else 0.0
        waited = self._waited + ongoing
        return (wall if self.mode == "wall" else wall - waited), waited, wall

    @property
    def is_waiting(self) -> bool:
        return self._wait_started is not None

    @contextmanager
    def waiting(self, expected: float | None, why: str) -> Iterator[None]:
        record = WaitRecord(at_charged=round(self.charged(), 4), expected=expected, why=why)
        self.waits.append(record)
        started = self._now()
        if self._depth == 0:
            self._wait_started = started
        self._depth += 1
        self.changed.set()
        try:
            yield
        finally:
            self._depth -= 1
            record.seconds = round(self._now() - started, 4)
            if self._depth == 0 and self._wait_started is not None:
                self._waited += self._now() - self._wait_started
                self._wait_started = None
            self.changed.set()

    async def until_charged(self, target: float) -> None:
        """Return once `target` seconds have been charged (pausing while waits are under way)."""
        while True:
            self.changed.clear()
            if self.is_waiting and self.mode == "working":
                await self.changed.wait()
                continue
            remaining = target - self.charged()
            if remaining <= 0:
                return
            with suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=remaining)
