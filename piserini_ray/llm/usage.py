"""Token usage of one call, as providers report it (OpenAI and Anthropic field names)."""

from __future__ import annotations

from typing import Any

from piserini_ray.records import Usage


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


def usage_reported(response: Any) -> bool:
    """Whether the provider reported usage. litellm fills a missing block with zeros, and a
    real call always counts some prompt tokens, so all-zero means "not reported"."""
    usage = usage_from_response(response)
    return usage.input_tokens > 0 or usage.output_tokens > 0
