"""What the offline provider keeps of each request (`RecordedRequest`, in its request log) and
its own bill (`Bill`: every billed request's usage by tier and model).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from piserini_ray.offline.codec import Usage

__all__ = ["Bill", "BillLine", "RecordedRequest", "key_hash"]


@dataclass
class RecordedRequest:
    """One request as the server saw it, on any route; the API key only as a hash prefix."""

    seq: int
    model: str | None = None
    messages: list[Any] | None = None
    tools: list[Any] | None = None
    #: HTTP status returned; None when no response was sent (client gone or server stopped).
    status: int | None = None
    usage: Usage | None = None
    #: Fault or scripted kind applied (e.g. "http_500", "rate_limit", "quota" for a request a
    #: quota window refused), None for a normal reply.
    fault: str | None = None
    #: Answered by a scripted behaviour of an interceptor (the test kit's `EmulatedProvider`).
    scripted: bool = False
    key_hash: str | None = None
    conversation: str | None = None
    #: Seconds the server waited before answering (latency, scripted latency or hang).
    delayed: float = 0.0
    #: Requests being handled when this one arrived, itself included.
    concurrent: int = 0
    #: The route's codec: "chat", "deepseek", "messages" or "responses".
    route: str | None = None
    #: The tier it is billed at: "standard", "flex" or "priority" (OpenAI's `service_tier`
    #: request parameter), or "batch" for a request of a batch (`batch_id`).
    service_tier: str = "standard"
    batch_id: str | None = None
    #: The client left (or the server stopped) after the request was admitted: it is billed
    #: its prompt as uncached input and nothing else, as a provider bills a request it began.
    cut: bool = False
    #: When it arrived (epoch seconds), and the Retry-After header a scripted rate limit's reply
    #: carried: a test checks that a client came back no earlier than it was told, from the
    #: server's own clock.
    received_at: float = field(default_factory=time.time)
    retry_after: str | None = None


@dataclass
class BillLine:
    """What the emulator bills for one (tier, model): requests and their tokens."""

    requests: int = 0
    prompt_tokens: int = 0  # all of the prompt, cached and cache-written parts included
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0  # of which to Anthropic's 1-hour cache
    #: Requests cut after admission (`RecordedRequest.cut`) and their prompts, included above.
    cut_requests: int = 0
    cut_prompt_tokens: int = 0


class Bill:
    """The emulator's own bill: every billed request's usage by (tier, model), kept whole
    however short the request log is."""

    def __init__(self) -> None:
        self.lines: dict[tuple[str, str], BillLine] = {}

    def add(self, record: RecordedRequest) -> None:
        usage = record.usage
        assert usage is not None
        line = self.lines.setdefault((record.service_tier, str(record.model)), BillLine())
        line.requests += 1
        line.prompt_tokens += usage.prompt_tokens
        line.completion_tokens += usage.completion_tokens
        line.cached_tokens += usage.cached_tokens
        line.cache_write_tokens += usage.cache_write_tokens
        line.cache_write_1h_tokens += usage.cache_write_1h_tokens
        if record.cut:
            line.cut_requests += 1
            line.cut_prompt_tokens += usage.prompt_tokens


def key_hash(key: str) -> str:
    """The 12-hex-digit SHA-256 prefix that stands for an API key in records and logs."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]
