"""OpenAI's Chat Completions API (`POST /v1/chat/completions`) on the offline provider: its
codec (errors in OpenAI's format, `openai_format.py`) and the prefix caching of the chat routes.

Prefix caching, shaped like real providers' (whose prompt starts with the tool definitions): the
cacheable prefix of a request is its `tools`, then its messages, whole items only. A
conversation is identified by a hash of the model and its first two messages (system + first
user, typically); the shared prefix is the longest leading run of (tools, messages...) shared
with the most recent earlier successful request of that conversation. A first request still
hits the cache for tools + system message when any earlier request of the same model started
the same way (the shared system prompt, as on a real provider). The reply priming is never
cached, so `cached_tokens < prompt_tokens` always holds. OpenAI bills the shared prefix in steps
(none under 1,024 tokens, then multiples of 128 above that, as on the Responses route);
DeepSeek whole messages (its prefix units, `deepseek.py`).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, cast

import orjson
from aiohttp import web

from piserini_ray.offline.codec import Codec, Encoded, Parsed, Problem, Usage, decode_json_object
from piserini_ray.offline.openai_format import (
    bearer_key,
    missing_bearer_key,
    openai_error,
    sampling_problem,
)
from piserini_ray.offline.policy import PolicyReply
from piserini_ray.offline.responses import openai_cached
from piserini_ray.offline.tokens import (
    count_completion_tokens,
    count_message_tokens,
    count_prompt_tokens,
    count_text_tokens,
)

#: Conversations remembered for prefix caching; the least recently used are forgotten first.
MAX_CONVERSATIONS = 10_000


def _validate(body: dict[str, Any]) -> tuple[str, str] | None:
    """(param, message) of the first problem with a chat-completions body, or None."""
    if not isinstance(body.get("model"), str):
        return "model", "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages", "messages must be a non-empty list"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "messages", "each message must be an object with a role"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "tools", "tools must be a list"
    return sampling_problem(body)


class ConversationCache:
    """Prefix caching of the chat routes (see the module docstring); thread-safe."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._conversations: OrderedDict[str, list[bytes]] = OrderedDict()
            self._heads: set[str] = set()

    def shared(
        self, model: str, messages: list[dict[str, Any]], tools: list[Any] | None
    ) -> tuple[str, int]:
        """(conversation id, tokens of the prefix shared with what was seen); remembers this
        request for the next one."""
        conversation = hashlib.sha256(
            orjson.dumps([model, messages[:2]], option=orjson.OPT_SORT_KEYS)
        ).hexdigest()[:16]
        if not self.enabled:
            return conversation, 0
        # Digests, not the messages: the cache holds thousands of long conversations.
        items = [
            hashlib.blake2b(orjson.dumps(x, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
            for x in [tools or [], *messages]
        ]
        head = hashlib.sha256(model.encode() + b"\0" + b"\0".join(items[:2])).hexdigest()
        with self._lock:
            previous = self._conversations.pop(conversation, [])
            self._conversations[conversation] = items
            while len(self._conversations) > MAX_CONVERSATIONS:
                self._conversations.popitem(last=False)
            head_seen = head in self._heads
            self._heads.add(head)
        shared = 0
        for old, new in zip(previous, items, strict=False):
            if old != new:
                break
            shared += 1
        if shared < 2 and head_seen and len(items) >= 2:
            shared = 2  # tools + system prompt, cached by an earlier conversation
        # Counted exactly as `count_prompt_tokens` counts the tools part of the prompt.
        cached = count_text_tokens(orjson.dumps(list(tools)).decode()) if tools and shared else 0
        return conversation, cached + sum(
            count_message_tokens(m) for m in messages[: max(0, shared - 1)]
        )


class ChatCodec(Codec):
    """OpenAI's Chat Completions."""

    name = "chat"

    def __init__(self, cache: ConversationCache) -> None:
        self.cache = cache
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)

    def api_key(self, headers: Mapping[str, str]) -> str | None:
        return bearer_key(headers)

    def missing_key(self) -> Problem:
        return missing_bearer_key()

    def decode(self, raw: bytes) -> dict[str, Any]:
        return decode_json_object(raw)

    def describe(
        self, body: dict[str, Any]
    ) -> tuple[str | None, list[Any] | None, list[Any] | None]:
        model, messages, tools = body.get("model"), body.get("messages"), body.get("tools")
        return (
            model if isinstance(model, str) else None,
            messages if isinstance(messages, list) else None,
            tools if isinstance(tools, list) else None,
        )

    def validate(self, body: dict[str, Any]) -> Parsed:
        problem = _validate(body)
        if problem is not None:
            param, text = problem
            raise Problem("invalid_request", text, param=param)
        if body.get("stream"):
            raise Problem(
                "invalid_request",
                "streaming is not supported by the offline provider; send stream: false",
                code="unsupported_value",
                param="stream",
            )
        # `_validate` checked the shapes: a model name and a list of message objects.
        messages = cast(list[dict[str, Any]], body["messages"])
        tools = body.get("tools")
        return Parsed(body, str(body["model"]), lambda: count_prompt_tokens(messages, tools))

    def unknown_model(self, model: str, served: list[str]) -> Problem:
        return Problem(
            "not_found",
            f"The model `{model}` does not exist on the offline provider "
            f"(serving: {', '.join(served)})",
            param="model",
        )

    def policy_request(self, parsed: Parsed) -> dict[str, Any]:
        return parsed.body

    def message(self, parsed: Parsed, reply: PolicyReply) -> tuple[dict[str, Any], int, int]:
        """The assistant message of the reply, its completion tokens and, of those, its
        reasoning tokens."""
        tool_calls = [
            {
                "id": call.id or f"call_{next(self._call_ids)}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.tool_calls
        ]
        content = reply.content if reply.content is not None or tool_calls else ""
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message, count_completion_tokens(content, tool_calls), 0

    def cached(self, shared: int) -> int:
        """Cached tokens billed for a shared prefix of `shared` tokens."""
        return openai_cached(shared)

    def usage_block(
        self, prompt: int, completion: int, cached: int, reasoning: int
    ) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    def encode(self, parsed: Parsed, reply: PolicyReply, key_hash: str | None) -> Encoded:
        message, completion, reasoning = self.message(parsed, reply)
        messages = cast(list[dict[str, Any]], parsed.body["messages"])
        conversation, shared = self.cache.shared(parsed.model, messages, parsed.body.get("tools"))
        cached = self.cached(shared)
        prompt = parsed.prompt_tokens
        body = {
            "id": f"chatcmpl-offline-{next(self._completion_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": parsed.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": self.usage_block(prompt, completion, cached, reasoning),
        }
        return Encoded(body, Usage(prompt, completion, cached), conversation)

    def error(self, problem: Problem) -> web.Response:
        return openai_error(problem)

    def reset(self) -> None:
        self.cache.reset()
