"""A live progress line: done / running / waiting on the limiter / failed / timeouts, tokens and
cost so far (with the part estimated for calls cut at the budget or failed after sending).
Redrawn in place on a terminal, printed every few seconds otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TextIO

from piserini_ray.records import Usage


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, every: float = 5.0) -> None:
        self.total = total
        # (Looked up now, not at import: a test's captured stderr is replaced between tests.)
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.every = every
        self.statuses: Counter[str] = Counter()
        self.usage = Usage()
        self.cost = 0.0
        self.cost_known = True
        #: Of `cost`, the estimate for calls no provider reported (their prompts).
        self.estimated_cost = 0.0
        self.running = 0
        self.waiting = 0
        self.started = time.monotonic()
        self._last = 0.0

    def record(
        self, status: str, usage: Usage, cost: float | None, estimated_cost: float = 0.0
    ) -> None:
        """A query ended: its status, usage and cost (None: unpriced), and of that cost the
        part estimated for its calls cut at the budget or failed after sending."""
        self.statuses[status] += 1
        self.usage = self.usage + usage
        if cost is None:
            self.cost_known = False
        else:
            self.cost += cost
            self.estimated_cost += estimated_cost

    def line(self) -> str:
        done = sum(self.statuses.values())
        width = 24
        filled = int(width * done / max(1, self.total))
        cost = f"${self.cost:,.2f}" if self.cost_known else f"${self.cost:,.2f}+ (some unpriced)"
        if self.estimated_cost:
            cost += f" (${self.estimated_cost:,.2f} estimated)"
        estimated = self.usage.estimated_input_tokens
        tokens = f"{self.usage.input_tokens + self.usage.output_tokens:,}" + (
            f" ({estimated:,} estimated)" if estimated else ""
        )
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} done | "
            f"running {self.running} | waiting on limiter {self.waiting} | "
            f"failed {self.statuses['failed']} | timeouts {self.statuses['timeout']} | "
            f"tokens {tokens} | cost {cost} | "
            f"{time.monotonic() - self.started:,.0f} s"
        )

    def show(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.live:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
        elif force or now - self._last >= self.every:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._last = now

    def close(self) -> None:
        """The last line: what ended, with nothing left running."""
        self.running = 0
        self.waiting = 0
        self.show(force=True)
        if self.live:
            self.stream.write("\n")
