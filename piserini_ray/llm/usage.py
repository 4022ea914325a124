"""Token usage of one call, as providers report it (OpenAI and Anthropic field names)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    #: Input tokens served from the provider's prompt cache (billed at the cache-read price).
    cached_tokens: int = 0
    #: Input tokens written to the cache, where a provider bills that separately (Anthropic).
    cache_write_tokens: int = 0
    #: Output tokens spent on hidden reasoning, where reported (already inside output_tokens).
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f: getattr(self, f) + getattr(other, f) for f in Usage.model_fields})


def _get(obj: Any, *names: str) -> int:
    """The first of `names` present on `obj` (attribute or key) as an int, else 0."""
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if isinstance(value, int | float):
            return int(value)
    return 0


def usage_from_response(response: Any) -> Usage:
    """Read litellm's `response.usage` (OpenAI shape, with Anthropic cache fields if present)."""
    usage = getattr(response, "usage", None) or {}
    details = (
        usage.get("prompt_tokens_details") if isinstance(usage, dict)
        else getattr(usage, "prompt_tokens_details", None)
    ) or {}  # fmt: skip
    completion_details = (
        usage.get("completion_tokens_details") if isinstance(usage, dict)
        else getattr(usage, "completion_tokens_details", None)
    ) or {}  # fmt: skip
    return Usage(
        input_tokens=_get(usage, "prompt_tokens", "input_tokens"),
        output_tokens=_get(usage, "completion_tokens", "output_tokens"),
        cached_tokens=_get(details, "cached_tokens") or _get(usage, "cache_read_input_tokens"),
        cache_write_tokens=_get(usage, "cache_creation_input_tokens"),
        reasoning_tokens=_get(completion_details, "reasoning_tokens"),
    )
