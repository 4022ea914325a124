"""A live progress line: done / running / waiting on the limiter / failed / timeouts, tokens and
cost so far (with the part estimated for calls cut at the budget or failed after sending), and
the time left at the pace so far; in a sweep, one more line per run. Redrawn in place on a
terminal, printed every few seconds otherwise (logs, CI). Each run's whole live status is its
`status.json` (`monitor/`)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from piserini_ray.records import Usage


@dataclass
class RunLine:
    """One run's share of a sweep's progress."""

    total: int
    statuses: Counter[str] = field(default_factory=Counter)
    cost: float = 0.0
    cost_known: bool = True

    def text(self, name: str) -> str:
        done = sum(self.statuses.values())
        cost = f"${self.cost:,.2f}" + ("" if self.cost_known else "+")
        return (
            f"  {name}: {done}/{self.total} done | failed {self.statuses['failed']} | "
            f"timeouts {self.statuses['timeout']} | cost {cost}"
        )


def eta_text(done: int, total: int, elapsed: float) -> str:
    """The time left at the pace so far (`ETA 3 min 20 s`), or `ETA ?` before the first."""
    if done >= total:
        return "ETA 0 s"
    if done == 0 or elapsed <= 0:
        return "ETA ?"
    left = round((total - done) * elapsed / done)
    minutes, seconds = divmod(left, 60)
    return f"ETA {minutes} min {seconds} s" if minutes else f"ETA {seconds} s"


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
        #: Each run's line, when several share this progress (a sweep on Ray).
        self.runs: dict[str, RunLine] = {}
        self._drawn = 0  # lines drawn on the terminal last time (redrawn in place)

    def add_run(self, name: str, total: int) -> None:
        """A run of the sweep this progress sums, shown on a line of its own."""
        self.runs[name] = RunLine(total)

    def record(
        self,
        status: str,
        usage: Usage,
        cost: float | None,
        estimated_cost: float = 0.0,
        run: str | None = None,
    ) -> None:
        """A query of `run` ended: its status, usage and cost (None: unpriced), and of that
        cost the part estimated for its calls cut at the budget or failed after sending."""
        self.statuses[status] += 1
        self.usage = self.usage + usage
        if cost is None:
            self.cost_known = False
        else:
            self.cost += cost
            self.estimated_cost += estimated_cost
        line = self.runs.get(run) if run is not None else None
        if line is not None:
            line.statuses[status] += 1
            line.cost += cost or 0.0
            line.cost_known = line.cost_known and cost is not None

    def line(self) -> str:
        done = sum(self.statuses.values())
        elapsed = time.monotonic() - self.started
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
            f"{elapsed:,.0f} s | {eta_text(done, self.total, elapsed)}"
        )

    def lines(self) -> list[str]:
        """The summed line, then one per run of a sweep."""
        if len(self.runs) < 2:
            return [self.line()]
        return [self.line(), *(line.text(name) for name, line in self.runs.items())]

    def show(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.live:
            up = f"\x1b[{self._drawn - 1}F" if self._drawn > 1 else "\r"  # back to the first
            lines = self.lines()
            self.stream.write(up + "\n".join(line + "\x1b[K" for line in lines))
            self.stream.flush()
            self._drawn = len(lines)
        elif force or now - self._last >= self.every:
            self.stream.write("\n".join(self.lines()) + "\n")
            self.stream.flush()
            self._last = now

    def close(self) -> None:
        """The last line: what ended, with nothing left running."""
        self.running = 0
        self.waiting = 0
        self.show(force=True)
        if self.live:
            self.stream.write("\n")
