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
- Error codes (https://api-docs.deepseek.com/quick_start/error_codes): OpenAI's error body;
  402 Insufficient Balance (sent as `{"error": {"message": "Insufficient Balance", "type":
  "unknown_error", "param": null, "code": "invalid_request_error"}}`), 429 Rate Limit Reached,
  500 Server Error, 503 Server Overloaded. DeepSeek publishes no rate-limit headers, so its
  429s carry `retry-after` alone (and the window in the body's `type`, as OpenAI's do).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from piserini_ray.offline.chat import ChatCodec
from piserini_ray.offline.codec import Parsed, Problem
from piserini_ray.offline.openai_format import openai_error
from piserini_ray.offline.policy import PolicyReply, reasoning_text
from piserini_ray.offline.tokens import count_text_tokens

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


class DeepSeekCodec(ChatCodec):
    """DeepSeek's chat API: the OpenAI codec with DeepSeek's rules, usage and errors."""

    name = "deepseek"

    def validate(self, body: dict[str, Any]) -> Parsed:
        parsed = super().validate(body)
        if (refused := problem(body)) is not None:
            raise Problem("invalid_request", refused)
        return parsed

    def message(self, parsed: Parsed, reply: PolicyReply) -> tuple[dict[str, Any], int, int]:
        message, completion, _ = super().message(parsed, reply)
        if not thinking_enabled(parsed.body):
            return message, completion, 0
        message["reasoning_content"] = reasoning_text(reply)
        reasoning = count_text_tokens(message["reasoning_content"])
        return message, completion + reasoning, reasoning

    def cached(self, shared: int) -> int:
        return shared  # whole messages, DeepSeek's prefix units

    def usage_block(
        self, prompt: int, completion: int, cached: int, reasoning: int
    ) -> dict[str, Any]:
        return usage(prompt, completion, cached, reasoning)

    def error(self, problem: Problem) -> web.Response:
        if problem.kind == "quota_exhausted":
            body = {
                "error": {
                    "message": problem.message or "Insufficient Balance",
                    "type": "unknown_error",
                    "param": None,
                    "code": "invalid_request_error",
                }
            }
            return web.json_response(body, status=402)
        return openai_error(problem, rate_limit_headers=False)
