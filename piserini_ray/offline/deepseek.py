"""DeepSeek's chat API on the offline provider (`/deepseek/chat/completions`): the OpenAI shape
with DeepSeek's differences, as litellm's native `deepseek/` route meets them in production.

The rules, from DeepSeek's published API documents:
- Thinking mode (https://api-docs.deepseek.com/guides/thinking_mode, and the reasoning model
  guide https://api-docs.deepseek.com/guides/reasoning_model): turned on by
  `thinking: {"type": "enabled"}` (or a reasoner model); a reply carries its chain of thought
  in `reasoning_content` beside `content`; in a tool-calling loop every assistant turn that made
  tool calls must be sent back with its `reasoning_content`, or the API answers 400 "The
  reasoning_content in the thinking mode must be passed back to the API".
- Context caching (https://api-docs.deepseek.com/guides/kv_cache): automatic on repeated
  prefixes, reported as `prompt_cache_hit_tokens` and `prompt_cache_miss_tokens` in `usage`
  (no `prompt_tokens_details`); reasoning tokens in `completion_tokens_details`.
"""

from __future__ import annotations

from typing import Any

MISSING_REASONING = "The reasoning_content in the thinking mode must be passed back to the API."


def thinking_enabled(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    enabled = isinstance(thinking, dict) and thinking.get("type") == "enabled"
    return enabled or "reasoner" in str(body.get("model", ""))


def problem(body: dict[str, Any]) -> str | None:
    """What DeepSeek refuses in an otherwise valid chat request, if anything."""
    if not thinking_enabled(body):
        return None
    for message in body.get("messages") or []:
        if (
            message.get("role") == "assistant"
            and message.get("tool_calls")
            and not str(message.get("reasoning_content") or "").strip()
        ):
            return MISSING_REASONING
    return None


def usage(prompt: int, completion: int, cached: int, reasoning: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_cache_hit_tokens": cached,
        "prompt_cache_miss_tokens": prompt - cached,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
