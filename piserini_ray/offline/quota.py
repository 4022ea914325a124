"""Per-key quotas of the offline provider: requests and tokens over a sliding window.

A request is admitted when its key's window holds fewer than `requests_per_minute` requests and
its tokens (prompt + completion of admitted requests) plus this request's prompt tokens stay
within `tokens_per_minute`. A refused request consumes nothing and is answered with a
`Problem` of kind `rate_limit` that names the window that refused it and carries every
configured window's state (limit, remaining, seconds until fully replenished), which each codec
renders as its provider's rate-limit headers.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from piserini_ray.config.offline import QuotaConfig
from piserini_ray.offline.codec import Problem, Window


class Quotas:
    """The windows of every key; thread-safe (the test thread resets them)."""

    def __init__(self, config: QuotaConfig, now: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._now = now
        self._lock = threading.Lock()
        #: Admitted requests of each key: [monotonic time, tokens].
        self._windows: dict[str, deque[list[float]]] = {}

    @property
    def enabled(self) -> bool:
        return (
            self.config.requests_per_minute is not None or self.config.tokens_per_minute is not None
        )

    def reset(self) -> None:
        with self._lock:
            self._windows.clear()

    def admit(self, key: str, prompt_tokens: Callable[[], int]) -> list[float] | None:
        """Enter an admitted request in its key's window and return its entry (None when no
        quota is configured); raise `Problem` when a window refuses it. `prompt_tokens` is
        called only when a token quota is set."""
        if not self.enabled:
            return None
        quotas = self.config
        rpm, tpm = quotas.requests_per_minute, quotas.tokens_per_minute
        prompt = prompt_tokens() if tpm is not None else 0
        now = self._now()
        with self._lock:
            entries = self._windows.setdefault(key, deque())
            while entries and entries[0][0] <= now - quotas.window_seconds:
                entries.popleft()
            if rpm is not None and len(entries) >= rpm:
                wait = entries[len(entries) - rpm][0] + quotas.window_seconds - now
                detail = f"Limit {rpm}, Used {len(entries)}, Requested 1."
                raise self._refusal("requests", wait, detail, entries, now)
            if tpm is not None:
                used = int(sum(entry[1] for entry in entries))
                if used + prompt > tpm:
                    if prompt > tpm:
                        wait = quotas.window_seconds  # never fits; say so, as OpenAI does
                        detail = f"Request too large: Limit {tpm}, Requested {prompt}."
                    else:
                        freed, wait = 0.0, quotas.window_seconds
                        for stamp, tokens in entries:
                            freed += tokens
                            if used - freed + prompt <= tpm:
                                wait = stamp + quotas.window_seconds - now
                                break
                        detail = f"Limit {tpm}, Used {used}, Requested {prompt}."
                    raise self._refusal("tokens", wait, detail, entries, now)
            entry = [now, float(prompt)]
            entries.append(entry)
            return entry

    def add(self, entry: list[float] | None, tokens: int) -> None:
        """Count an admitted request's completion in its window."""
        if entry is not None:
            with self._lock:
                entry[1] += tokens

    def _refusal(
        self,
        window: Literal["requests", "tokens"],
        wait: float,
        detail: str,
        entries: deque[list[float]],
        now: float,
    ) -> Problem:
        """The 429 for a full window: `Retry-After` in whole seconds (at least 1), rounded up
        so the client never comes back too early."""
        return Problem(
            "rate_limit",
            retry_after=str(max(1, math.ceil(wait))),
            window=window,
            limits=self._limits(entries, now),
            detail=detail,
        )

    def _limits(self, entries: deque[list[float]], now: float) -> tuple[Window, ...]:
        """Each configured window as it stands (the refused request not counted)."""
        quotas = self.config
        # Fully replenished once the newest admitted request leaves the window.
        reset = max(0.0, entries[-1][0] + quotas.window_seconds - now) if entries else 0.0
        limits = []
        if quotas.requests_per_minute is not None:
            rpm = quotas.requests_per_minute
            limits.append(Window("requests", rpm, max(0, rpm - len(entries)), reset))
        if quotas.tokens_per_minute is not None:
            tpm = quotas.tokens_per_minute
            used = int(sum(entry[1] for entry in entries))
            limits.append(Window("tokens", tpm, max(0, tpm - used), reset))
        return tuple(limits)
