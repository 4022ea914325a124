"""OpenAI's Responses API (`POST /v1/responses`) on the offline provider: what litellm's
chat-to-responses bridge speaks for gpt-5.4 and later with function tools and a reasoning
effort (`litellm/main.py::responses_api_bridge_check`).

The rules, from OpenAI's published API documents:
- Responses API reference (https://platform.openai.com/docs/api-reference/responses/create):
  `model` and `input` are required; the system prompt may come as `instructions`; function tools
  are flat (`{type: function, name, parameters}`); a `function_call_output` answers a
  `function_call` of the same `call_id` earlier in `input` ("No tool call found for function call
  output with call_id ...").
- Reasoning (https://platform.openai.com/docs/guides/reasoning): replies start with a
  `reasoning` item; sent back with its `encrypted_content`, it must be the one the API issued.
  Usage carries `output_tokens_details.reasoning_tokens`.
- Errors are OpenAI's (`openai_format.py`); a response that fails after it was accepted is a 200
  whose `status` is `failed`, with `error: {code, message}` (a scripted `error_body` here).
- Prompt caching (https://platform.openai.com/docs/guides/prompt-caching): automatic for prompts
  of 1,024 tokens or more; the cached prefix is counted in steps of 128 tokens from 1,024
  (`input_tokens_details.cached_tokens`).

Replies come from the same policies as the other routes (the request shown to the policy in the
chat-completions shape). Ids follow OpenAI's forms (`rs_` and `fc_` with hex, `call_` with
letters): litellm treats `rs_<uuid>` as its own and drops it on replay.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from piserini_ray.offline.anthropic import Signer
from piserini_ray.offline.codec import (
    Codec,
    Encoded,
    Parsed,
    Problem,
    Usage,
    decode_json_object,
    refused,
)
from piserini_ray.offline.openai_format import (
    bearer_key,
    missing_bearer_key,
    openai_error,
    sampling_problem,
)
from piserini_ray.offline.policy import PolicyReply, function_tool, reasoning_text
from piserini_ray.offline.tokens import count_completion_tokens, count_text_tokens

MIN_CACHED_TOKENS = 1024
CACHE_STEP = 128


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text", "")) for p in content or [] if isinstance(p, dict)
    )  # input_text / output_text parts


def validate(body: dict[str, Any], signer: Signer) -> None:
    """Raise `Problem` for what the real API rejects."""
    for field in ("model", "input"):
        if field not in body:
            raise refused(
                f"Missing required parameter: '{field}'.", field, "missing_required_parameter"
            )
    sampling = sampling_problem(body)
    if sampling is not None:
        raise refused(sampling[1], sampling[0], "invalid_value")
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise refused(
            "Invalid type for 'tools': expected an array of objects.", "tools", "invalid_type"
        )
    items = body["input"]
    if isinstance(items, str):
        return
    if not isinstance(items, list):
        raise refused(
            "Invalid type for 'input': expected one of a string or array of input items, but "
            f"got {type(items).__name__} instead.",
            "input",
            "invalid_type",
        )
    calls: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise refused(
                f"Invalid type for 'input[{i}]': expected an input item object.",
                f"input[{i}]",
                "invalid_type",
            )
        kind = item.get("type", "message")
        if kind == "function_call":
            calls.add(str(item.get("call_id")))
        elif kind == "function_call_output":
            if str(item.get("call_id")) not in calls:
                raise refused(
                    f"No tool call found for function call output with call_id "
                    f"{item.get('call_id')}."
                )
        elif kind == "reasoning":
            summary = _text(item.get("summary"))
            if not signer.valid(summary, item.get("encrypted_content")):
                raise refused(
                    f"input[{i}]: the encrypted content for item {item.get('id')} could not be "
                    "verified."
                )
        elif kind != "message":
            raise refused(
                f"input[{i}]: unsupported item type {kind!r}.", f"input[{i}].type", "invalid_value"
            )


def policy_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request in the chat-completions shape the policies read."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body["input"]
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role")
            messages.append({"role": role, "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not last.get("content"):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(output)}
            )
    tools = [
        function_tool(t, "parameters")
        for t in body.get("tools") or []
        if t.get("type") == "function"
    ]
    return {"model": body["model"], "messages": messages, "tools": tools or None}


class PrefixCache:
    """Prompt prefixes seen, per model and key: the cached part of a new prompt is its longest
    seen prefix, counted in OpenAI's steps (0 under 1,024 tokens, then multiples of 128)."""

    def __init__(self) -> None:
        self._prefixes: dict[bytes, int] = {}

    def usage(self, scope: str, body: dict[str, Any]) -> tuple[int, int]:
        """(prompt tokens, cached tokens), remembering this prompt's prefixes."""
        digest = hashlib.sha256(scope.encode()).digest()
        total = seen = 0
        for part in _prompt_parts(body):
            text = orjson.dumps(part, option=orjson.OPT_SORT_KEYS)
            total += count_text_tokens(text.decode()) if part else 0
            digest = hashlib.sha256(digest + text).digest()
            if digest in self._prefixes:
                seen = total
            self._prefixes[digest] = total
        return total, openai_cached(seen)


def _prompt_parts(body: dict[str, Any]) -> list[Any]:
    """The prompt in cache order: instructions, tools, then each input item."""
    items = body["input"]
    parts: list[Any] = [body.get("instructions"), body.get("tools") or []]
    return parts + ([items] if isinstance(items, str) else list(items))


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's tokens as `PrefixCache.usage` counts them."""
    return sum(
        count_text_tokens(orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode())
        for part in _prompt_parts(body)
        if part
    )


def openai_cached(shared: int) -> int:
    """What OpenAI bills as cached for a shared prefix of `shared` tokens: nothing under 1,024,
    then the largest 1,024 + k * 128 that fits (its Chat Completions and Responses alike)."""
    if shared < MIN_CACHED_TOKENS:
        return 0
    return MIN_CACHED_TOKENS + (shared - MIN_CACHED_TOKENS) // CACHE_STEP * CACHE_STEP


def output_items(reply: PolicyReply, reasoning: str, signer: Signer) -> list[dict[str, Any]]:
    """The reply as output items: a signed reasoning item first, then the calls or the text."""
    items: list[dict[str, Any]] = [
        {
            "type": "reasoning",
            "id": f"rs_{secrets.token_hex(12)}",
            "summary": [{"type": "summary_text", "text": reasoning}],
            "encrypted_content": signer.sign(reasoning),
        }
    ]
    for call in reply.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{secrets.token_hex(12)}",
                "call_id": f"call_x{secrets.token_hex(8)}",
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    if not reply.tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{secrets.token_hex(12)}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": reply.content or "", "annotations": []}
                ],
            }
        )
    return items


class ResponsesCodec(Codec):
    """OpenAI's Responses API (errors in OpenAI's format, the prompt's `param` being `input`)."""

    name = "responses"

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._caches: dict[str, PrefixCache] = {}

    def api_key(self, headers: Mapping[str, str]) -> str | None:
        return bearer_key(headers)

    def missing_key(self) -> Problem:
        return missing_bearer_key()

    def decode(self, raw: bytes) -> dict[str, Any]:
        body = decode_json_object(raw)
        if body.get("stream"):
            raise refused("stream: the offline provider answers stream: false", "stream")
        return body

    def describe(
        self, body: dict[str, Any]
    ) -> tuple[str | None, list[Any] | None, list[Any] | None]:
        items, tools = body.get("input"), body.get("tools")
        return (
            str(body.get("model")),
            items if isinstance(items, list) else None,
            tools if isinstance(tools, list) else None,
        )

    def validate(self, body: dict[str, Any]) -> Parsed:
        validate(body, self.signer)
        return Parsed(body, str(body["model"]), lambda: prompt_tokens(body))

    def unknown_model(self, model: str, served: list[str]) -> Problem:
        return Problem("not_found", f"The model `{model}` does not exist")

    def policy_request(self, parsed: Parsed) -> dict[str, Any]:
        return policy_request(parsed.body)

    def encode(self, parsed: Parsed, reply: PolicyReply, key_hash: str | None) -> Encoded:
        reasoning = reasoning_text(reply)
        output = output_items(reply, reasoning, self.signer)
        with self._lock:
            cache = self._caches.setdefault(f"{parsed.model}:{key_hash}", PrefixCache())
            prompt, cached = cache.usage(parsed.model, parsed.body)
        thought = count_text_tokens(reasoning)
        completion = thought + count_completion_tokens(
            reply.content,
            [{"function": {"name": c.name, "arguments": c.arguments}} for c in reply.tool_calls],
        )
        body = {
            "id": f"resp_{next(self._ids):06d}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": parsed.model,
            "output": output,
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": thought},
                "total_tokens": prompt + completion,
            },
        }
        return Encoded(body, Usage(prompt, completion, cached))

    def error(self, problem: Problem) -> web.Response:
        if problem.in_200:
            # A response that failed after it was accepted: a 200 whose status is `failed`.
            body = {
                "id": f"resp_{next(self._ids):06d}",
                "object": "response",
                "created_at": int(time.time()),
                "status": "failed",
                "error": {"code": "server_error", "message": problem.message or "failed"},
                "output": [],
                "usage": None,
            }
            return web.json_response(body)
        return openai_error(problem, prompt_param="input")

    def reset(self) -> None:
        with self._lock:
            self._caches.clear()
