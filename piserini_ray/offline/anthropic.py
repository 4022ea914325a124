"""Anthropic's Messages API (`POST /v1/messages`) on the offline provider, as strict as the real
one where our client could go wrong, so that litellm's native `anthropic/` route is tested
against the wire format it speaks in production.

The rules, from Anthropic's published API documents:
- Messages API reference (https://docs.anthropic.com/en/api/messages): `model`, `max_tokens`
  and a non-empty `messages` are required; roles are `user` and `assistant` (the system prompt
  is the top-level `system`); the first message is a user turn; an `anthropic-version` header
  and (when keys are required) an `x-api-key` header.
- Tool use (https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/implement-tool-use):
  each `tool_use` block of an assistant turn is answered by a `tool_result` with its id in the
  very next user turn, and a `tool_result` must answer a `tool_use` of the turn before.
- Extended thinking (https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking):
  `thinking: {type: enabled, budget_tokens}` with `budget_tokens >= 1024` and below
  `max_tokens`; a temperature other than 1 is refused; replies start with a `thinking` block
  carrying a `signature`; in a tool-use loop the last assistant turn must be sent back starting
  with its thinking (or `redacted_thinking`) block, signature intact ("When `thinking` is
  enabled, a final `assistant` message must start with a thinking block").
- Prompt caching (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching): at most
  4 blocks carry `cache_control`; the prefix (tools, then system, then messages) up to each
  breakpoint is written to the cache, and a later request reads the longest cached prefix found
  at a breakpoint or at one of the 20 block boundaries before it; prefixes under the minimum
  cacheable length (1,024 tokens here) are not cached. Usage splits the prompt into
  `cache_read_input_tokens`, `cache_creation_input_tokens` and `input_tokens` (the rest).

- Errors (https://docs.anthropic.com/en/api/errors): `{"type": "error", "error": {"type",
  "message"}, "request_id"}` and a `request-id` header; the type follows the status (400
  `invalid_request_error`, 401 `authentication_error`, 402 `billing_error`, 403
  `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error`,
  500 `api_error`, 529 `overloaded_error`). A spend limit reached is a 429 `rate_limit_error`
  whose `error.details.error_code` is `enforced_spend_limit_reached`, without `retry-after`.
- Rate limits (https://docs.anthropic.com/en/api/rate-limits): a 429 carries `retry-after`
  (seconds) and, for each limit, `anthropic-ratelimit-<limit>-limit`, `-remaining` and `-reset`
  (when it is fully replenished, RFC 3339), for `requests`, `tokens`, `input-tokens` and
  `output-tokens`. The offline provider has one token window counting input and output
  together, so the three token families report that same window (its remaining tokens are all
  a request may still send or receive); Anthropic rounds `-remaining` of tokens to the nearest
  thousand, the emulator sends the exact count.

Replies come from the same policies as the chat-completions route: the request is shown to the
policy in the OpenAI shape and its reply is sent back as Anthropic content blocks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import math
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from piserini_ray.offline.codec import (
    Codec,
    Encoded,
    Parsed,
    Problem,
    Usage,
    Window,
    decode_json_object,
    refused,
)
from piserini_ray.offline.policy import PolicyReply, function_tool, reasoning_text
from piserini_ray.offline.tokens import count_text_tokens

MAX_CACHE_BREAKPOINTS = 4
CACHE_TTLS = ("5m", "1h")
MIN_CACHEABLE_TOKENS = 1024
LOOKBACK_BLOCKS = 20
MIN_THINKING_BUDGET = 1024


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise refused("messages: content must be a string or a list of content blocks")
    return list(content)


class Signer:
    """Signatures of the thinking blocks this server wrote (HMAC under a per-server secret), so
    a block that was altered or made up is refused as the real API refuses it."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, thinking: str) -> str:
        digest = hmac.new(self._secret, thinking.encode(), hashlib.sha256).digest()
        return base64.b64encode(digest).decode()

    def valid(self, thinking: Any, signature: Any) -> bool:
        return (
            isinstance(thinking, str)
            and isinstance(signature, str)
            and hmac.compare_digest(self.sign(thinking), signature)
        )


def validate(body: dict[str, Any], signer: Signer) -> bool:
    """Raise `Problem` for what the real API rejects; return whether thinking is on."""
    enabled = _validate_parameters(body)
    _validate_turns(body["messages"], signer, enabled)
    _validate_cache_marks(body)
    return enabled


def _validate_parameters(body: dict[str, Any]) -> bool:
    """The required fields, `max_tokens` and `thinking` (its budget, its temperature);
    whether thinking is on."""
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            raise refused(f"{field}: Field required")
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
        raise refused("max_tokens: must be a positive integer")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise refused("messages: at least one message is required")
    thinking = body.get("thinking") or {"type": "disabled"}
    if not isinstance(thinking, dict):
        raise refused("thinking: Input should be an object")
    enabled = thinking.get("type") == "enabled"
    if enabled:
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
            raise refused("thinking.enabled.budget_tokens: Input should be >= 1024")
        if budget >= body["max_tokens"]:
            raise refused("`max_tokens` must be greater than `thinking.budget_tokens`")
        if body.get("temperature") not in (None, 1, 1.0):
            raise refused(
                "`temperature` may only be set to 1 when thinking is enabled or in "
                "interleaved thinking mode"
            )
    return enabled


def _validate_turns(messages: list[Any], signer: Signer, enabled: bool) -> None:
    """Roles, tool_use / tool_result pairing, thinking signatures, and (thinking on) the
    final tool-use turn's leading thinking block."""
    previous_tool_uses: set[str] = set()
    unthought: tuple[int, Any] | None = None  # the final tool-use turn, when thinking is on
    assistants = [
        i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"
    ]
    last_assistant = assistants[-1] if assistants else None
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise refused(
                f"messages.{i}.role: Input should be 'user' or 'assistant' (the system prompt "
                "is the top-level `system` parameter)"
            )
        if i == 0 and role != "user":
            raise refused("messages: the first message must use the `user` role")
        blocks = _blocks(message.get("content"))
        answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        if role == "user":
            _check_results(i, previous_tool_uses, answered)
            previous_tool_uses = set()
            continue
        previous_tool_uses = _check_assistant_turn(i, blocks, answered, previous_tool_uses, signer)
        if enabled and i == last_assistant and previous_tool_uses:
            unthought = (i, blocks[0].get("type") if blocks else None)
    if previous_tool_uses:
        raise refused(
            "messages: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(sorted(previous_tool_uses))} (the last message is a tool call)"
        )
    if unthought is not None and unthought[1] not in ("thinking", "redacted_thinking"):
        raise refused(
            f"messages.{unthought[0]}.content.0.type: Expected `thinking` or "
            f"`redacted_thinking`, but found `{unthought[1]}`. When `thinking` is enabled, a "
            "final `assistant` message must start with a thinking block (preceeding the "
            "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
            "thinking blocks from previous turns."
        )


def _check_results(i: int, tool_uses: set[str], answered: set[Any]) -> None:
    """A user turn answers exactly the tool calls of the assistant turn before it."""
    missing = tool_uses - answered
    if missing:
        raise refused(
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
            f"immediately after: {', '.join(sorted(missing))}. Each `tool_use` block "
            "must have a corresponding `tool_result` block in the next message."
        )
    unknown = answered - tool_uses
    if unknown:
        raise refused(
            f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` "
            f"blocks: {', '.join(sorted(map(str, unknown)))}. Each `tool_result` block "
            "must have a corresponding `tool_use` block in the previous message."
        )


def _check_assistant_turn(
    i: int,
    blocks: list[dict[str, Any]],
    answered: set[Any],
    previous_tool_uses: set[str],
    signer: Signer,
) -> set[str]:
    """An assistant turn: no tool results, no unanswered calls before it, its thinking blocks
    signed by us; the ids of its tool calls."""
    if answered:
        raise refused(f"messages.{i}: `tool_result` blocks belong in a user turn")
    if previous_tool_uses:
        raise refused(
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
            f"immediately after: {', '.join(sorted(previous_tool_uses))}"
        )
    for j, block in enumerate(blocks):
        if block.get("type") == "thinking" and not signer.valid(
            block.get("thinking"), block.get("signature")
        ):
            raise refused(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
    return {str(b.get("id")) for b in blocks if b.get("type") == "tool_use"}


def _validate_cache_marks(body: dict[str, Any]) -> None:
    """At most four breakpoints, each ephemeral, 1-hour ones before 5-minute ones."""
    marks = [b["cache_control"] for _, b in _prompt_blocks(body) if "cache_control" in b]
    if len(marks) > MAX_CACHE_BREAKPOINTS:
        raise refused(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided."
        )
    for mark in marks:
        if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
            raise refused("cache_control.type: Input should be 'ephemeral'")
        if mark.get("ttl", "5m") not in CACHE_TTLS:
            raise refused("cache_control.ttl: Input should be '5m' or '1h'")
    ttls = [mark.get("ttl", "5m") for mark in marks]
    if "1h" in ttls and "5m" in ttls[: len(ttls) - ttls[::-1].index("1h")]:
        raise refused(
            "a cache_control block with ttl='1h' must not come after one with ttl='5m': "
            "longer-lived cache entries come first in the prompt"
        )


def _prompt_blocks(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The prompt in cache order: tools, system, then each message's blocks."""
    for tool in body.get("tools") or []:
        yield "tools", tool
    system = body.get("system")
    if system is not None:
        for block in _blocks(system):
            yield "system", block
    for message in body["messages"]:
        for block in _blocks(message.get("content")):
            yield str(message.get("role")), block


def _bare(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _block_tokens(role: str, bare: dict[str, Any]) -> int:
    return count_text_tokens(role) + count_text_tokens(orjson.dumps(bare).decode())


def prompt_tokens(body: dict[str, Any]) -> int:
    """The whole prompt's tokens as `PromptCache.usage` bills them (uncached + written + read)."""
    return sum(_block_tokens(role, _bare(block)) for role, block in _prompt_blocks(body))


class PromptCache:
    """Prefix digests this server has cached, per model and key."""

    def __init__(self) -> None:
        self._entries: set[bytes] = set()

    def usage(self, scope: str, body: dict[str, Any]) -> tuple[int, int, int, int]:
        """(uncached input, cache creation, of which to the 1-hour cache, cache read) tokens
        for this request, writing the prefixes at its breakpoints. A block counts as sent,
        without its cache marker (marking a block changes neither its size nor the prefix it
        ends); the tokens a breakpoint writes are billed at its `ttl`. Entries do not expire
        here."""
        digest = hashlib.sha256(scope.encode()).digest()
        # (digest, tokens so far, the block's cache_control ttl or "" when it has no mark)
        prefixes: list[tuple[bytes, int, str]] = []
        total = 0
        for role, block in _prompt_blocks(body):
            bare = _bare(block)
            total += _block_tokens(role, bare)
            digest = hashlib.sha256(
                digest + orjson.dumps([role, bare], option=orjson.OPT_SORT_KEYS)
            ).digest()
            mark = block.get("cache_control")
            prefixes.append((digest, total, mark.get("ttl", "5m") if mark else ""))
        breakpoints = [i for i, (_, _, ttl) in enumerate(prefixes) if ttl]
        read = 0
        for b in breakpoints:
            for i in range(b, max(-1, b - LOOKBACK_BLOCKS - 1), -1):
                found, tokens, _ = prefixes[i]
                if found in self._entries and tokens > read:
                    read = tokens
                    break
        written, written_1h = read, 0  # each breakpoint writes what the one before did not
        for b in breakpoints:
            found, tokens, ttl = prefixes[b]
            if tokens >= MIN_CACHEABLE_TOKENS:
                self._entries.add(found)
                if tokens > written:
                    if ttl == "1h":
                        written_1h += tokens - written
                    written = tokens
        creation = written - read
        return total - read - creation, creation, written_1h, read


def policy_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request in the chat-completions shape the policies read."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = "".join(b.get("text", "") for b in _blocks(system))
        messages.append({"role": "system", "content": text})
    for message in body["messages"]:
        blocks = _blocks(message["content"])
        if message["role"] == "user":
            for b in blocks:
                if b.get("type") == "tool_result":
                    content = b.get("content")
                    text = (
                        content
                        if isinstance(content, str)
                        else "".join(x.get("text", "") for x in _blocks(content or []))
                    )
                    messages.append(
                        {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text}
                    )
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            if text:
                messages.append({"role": "user", "content": text})
            continue
        calls = [
            {
                "id": b.get("id"),
                "type": "function",
                "function": {
                    "name": b.get("name"),
                    "arguments": orjson.dumps(b.get("input")).decode(),
                },
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        messages.append(
            {"role": "assistant", "content": text or None}
            | ({"tool_calls": calls} if calls else {})
        )
    tools = [function_tool(t, "input_schema") for t in body.get("tools") or []]
    return {"model": body["model"], "messages": messages, "tools": tools or None}


_IDS = itertools.count(1)


def reply_content(reply: PolicyReply, thinking: str | None, signer: Signer) -> list[dict[str, Any]]:
    """The policy's reply as content blocks, a signed thinking block first when thinking is on."""
    blocks: list[dict[str, Any]] = []
    if thinking is not None:
        blocks.append(
            {"type": "thinking", "thinking": thinking, "signature": signer.sign(thinking)}
        )
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        try:
            arguments = orjson.loads(call.arguments)
        except orjson.JSONDecodeError:
            arguments = {}  # the real API always sends a JSON object as `input`
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{next(_IDS):06d}",
                "name": call.name,
                "input": arguments,
            }
        )
    return blocks


#: The context window quoted by a scripted `context_window` error.
CONTEXT_WINDOW = 200_000
#: The error type of each status (any other 5xx: `api_error`; any other 4xx:
#: `invalid_request_error`).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_STATUS = {
    "invalid_request": 400,
    "authentication": 401,
    "not_found": 404,
    "rate_limit": 429,
    "quota_exhausted": 429,
    "server_error": 500,
    "overloaded": 529,
    "context_window": 400,
}
#: The rate-limit header families of each offline quota window.
_FAMILIES = {"requests": ("requests",), "tokens": ("tokens", "input-tokens", "output-tokens")}


def error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def rfc3339_in(seconds: float) -> str:
    """The moment `seconds` from now, in whole seconds rounded up (RFC 3339, UTC)."""
    moment = datetime.fromtimestamp(math.ceil(time.time() + seconds), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def rate_limit_headers(limits: tuple[Window, ...]) -> dict[str, str]:
    headers = {}
    for window in limits:
        reset = rfc3339_in(window.reset)
        for family in _FAMILIES[window.name]:
            headers[f"anthropic-ratelimit-{family}-limit"] = str(window.limit)
            headers[f"anthropic-ratelimit-{family}-remaining"] = str(window.remaining)
            headers[f"anthropic-ratelimit-{family}-reset"] = reset
    return headers


def _next_month() -> str:
    today = datetime.now(UTC).date()
    year, month = (today.year + 1, 1) if today.month == 12 else (today.year, today.month + 1)
    return f"{year:04d}-{month:02d}-01"


def _message(problem: Problem, status: int) -> str:
    """Anthropic's wording for a problem that brings none."""
    if problem.kind == "rate_limit" and problem.window is not None:
        limit = next((w.limit for w in problem.limits if w.name == problem.window), None)
        what = f"{limit:,} {problem.window}" if limit is not None else problem.window
        return (
            f"This request would exceed your organization's rate limit of {what} per minute "
            f"on the offline provider: {problem.detail} Please try again in "
            f"{problem.retry_after}s."
        )
    if problem.kind == "quota_exhausted":
        return (
            "You have reached your specified API usage limits. You will regain access on "
            f"{_next_month()} at 00:00 UTC."
        )
    if problem.kind == "context_window":
        tokens = max(problem.tokens or 0, CONTEXT_WINDOW + 1)
        return f"prompt is too long: {tokens} tokens > {CONTEXT_WINDOW} maximum"
    if problem.kind == "authentication":
        return "invalid x-api-key"
    return {529: "Overloaded", 500: "Internal server error"}.get(status) or error_type(status)


class MessagesCodec(Codec):
    """Anthropic's Messages API."""

    name = "messages"

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._caches: dict[str, PromptCache] = {}

    def api_key(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("x-api-key") or None

    def missing_key(self) -> Problem:
        return Problem("authentication", "x-api-key header is required")

    def check_headers(self, headers: Mapping[str, str]) -> None:
        if "anthropic-version" not in headers:
            raise refused("anthropic-version: header is required")

    def decode(self, raw: bytes) -> dict[str, Any]:
        body = decode_json_object(raw)
        if body.get("stream"):
            raise refused("stream: the offline provider answers stream: false")
        return body

    def describe(
        self, body: dict[str, Any]
    ) -> tuple[str | None, list[Any] | None, list[Any] | None]:
        messages, tools = body.get("messages"), body.get("tools")
        return (
            str(body.get("model")),
            messages if isinstance(messages, list) else None,
            tools if isinstance(tools, list) else None,
        )

    def validate(self, body: dict[str, Any]) -> Parsed:
        thinking = validate(body, self.signer)
        return Parsed(body, str(body["model"]), lambda: prompt_tokens(body), {"thinking": thinking})

    def unknown_model(self, model: str, served: list[str]) -> Problem:
        return Problem("not_found", f"model: {model}")

    def policy_request(self, parsed: Parsed) -> dict[str, Any]:
        return policy_request(parsed.body)

    def encode(self, parsed: Parsed, reply: PolicyReply, key_hash: str | None) -> Encoded:
        thought = reasoning_text(reply) if parsed.options["thinking"] else None
        content = reply_content(reply, thought, self.signer)
        with self._lock:
            cache = self._caches.setdefault(f"{parsed.model}:{key_hash}", PromptCache())
            uncached, written, written_1h, read = cache.usage(parsed.model, parsed.body)
        output = sum(
            count_text_tokens(
                orjson.dumps({k: v for k, v in b.items() if k != "signature"}).decode()
            )
            for b in content
        )
        body = {
            "id": f"msg_offline_{next(self._ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": parsed.model,
            "content": content,
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": uncached,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": written - written_1h,
                    "ephemeral_1h_input_tokens": written_1h,
                },
                "output_tokens": output,
            },
        }
        return Encoded(body, Usage(uncached + written + read, output, read, written, written_1h))

    def error(self, problem: Problem) -> web.Response:
        status = problem.status or _STATUS[problem.kind]
        # An error object inside a 200 still says what failed.
        typed = _STATUS[problem.kind] if problem.in_200 else status
        error: dict[str, Any] = {
            "type": error_type(typed),
            "message": problem.message or _message(problem, typed),
        }
        if problem.kind == "quota_exhausted":
            error["details"] = {"error_code": "enforced_spend_limit_reached"}
        request_id = f"req_offline_{secrets.token_hex(12)}"
        headers = {"request-id": request_id} | rate_limit_headers(problem.limits)
        if problem.retry_after is not None:
            headers["retry-after"] = problem.retry_after
        body = {"type": "error", "error": error, "request_id": request_id}
        return web.json_response(body, status=200 if problem.in_200 else status, headers=headers)

    def reset(self) -> None:
        with self._lock:
            self._caches.clear()
