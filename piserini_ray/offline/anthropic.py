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

Replies come from the same policies as the chat-completions route: the request is shown to the
policy in the OpenAI shape and its reply is sent back as Anthropic content blocks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
from collections.abc import Iterator
from typing import Any

import orjson

from piserini_ray.offline.policy import PolicyReply, function_tool
from piserini_ray.offline.tokens import count_text_tokens

MAX_CACHE_BREAKPOINTS = 4
MIN_CACHEABLE_TOKENS = 1024
LOOKBACK_BLOCKS = 20
MIN_THINKING_BUDGET = 1024


class RequestError(Exception):
    """A request the real API rejects: HTTP status, Anthropic error type and message."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_body(error: RequestError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error.kind, "message": str(error)}}


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise RequestError("messages: content must be a string or a list of content blocks")
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
    """Raise `RequestError` for what the real API rejects; return whether thinking is on."""
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            raise RequestError(f"{field}: Field required")
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
        raise RequestError("max_tokens: must be a positive integer")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: at least one message is required")
    thinking = body.get("thinking") or {"type": "disabled"}
    enabled = thinking.get("type") == "enabled"
    if enabled:
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
            raise RequestError("thinking.enabled.budget_tokens: Input should be >= 1024")
        if budget >= body["max_tokens"]:
            raise RequestError("`max_tokens` must be greater than `thinking.budget_tokens`")
        if body.get("temperature") not in (None, 1, 1.0):
            raise RequestError(
                "`temperature` may only be set to 1 when thinking is enabled or in "
                "interleaved thinking mode"
            )
    previous_tool_uses: set[str] = set()
    unthought: tuple[int, Any] | None = None  # the final tool-use turn, when thinking is on
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    last_assistant = assistants[-1] if assistants else None
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise RequestError(
                f"messages.{i}.role: Input should be 'user' or 'assistant' (the system prompt "
                "is the top-level `system` parameter)"
            )
        if i == 0 and role != "user":
            raise RequestError("messages: the first message must use the `user` role")
        blocks = _blocks(message.get("content"))
        answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        if role == "user":
            missing = previous_tool_uses - answered
            if missing:
                raise RequestError(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(sorted(missing))}. Each `tool_use` block "
                    "must have a corresponding `tool_result` block in the next message."
                )
            unknown = answered - previous_tool_uses
            if unknown:
                raise RequestError(
                    f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {', '.join(sorted(map(str, unknown)))}. Each `tool_result` block "
                    "must have a corresponding `tool_use` block in the previous message."
                )
            previous_tool_uses = set()
            continue
        if answered:
            raise RequestError(f"messages.{i}: `tool_result` blocks belong in a user turn")
        if previous_tool_uses:
            raise RequestError(
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(sorted(previous_tool_uses))}"
            )
        previous_tool_uses = {str(b.get("id")) for b in blocks if b.get("type") == "tool_use"}
        for j, block in enumerate(blocks):
            if block.get("type") == "thinking" and not signer.valid(
                block.get("thinking"), block.get("signature")
            ):
                raise RequestError(
                    f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                )
        if enabled and i == last_assistant and previous_tool_uses:
            unthought = (i, blocks[0].get("type") if blocks else None)
    if previous_tool_uses:
        raise RequestError(
            "messages: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(sorted(previous_tool_uses))} (the last message is a tool call)"
        )
    if unthought is not None and unthought[1] not in ("thinking", "redacted_thinking"):
        raise RequestError(
            f"messages.{unthought[0]}.content.0.type: Expected `thinking` or "
            f"`redacted_thinking`, but found `{unthought[1]}`. When `thinking` is enabled, a "
            "final `assistant` message must start with a thinking block (preceeding the "
            "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
            "thinking blocks from previous turns."
        )
    if sum(1 for _, b in _prompt_blocks(body) if "cache_control" in b) > MAX_CACHE_BREAKPOINTS:
        raise RequestError(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided."
        )
    return enabled


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


class PromptCache:
    """Prefix digests this server has cached, per model and key."""

    def __init__(self) -> None:
        self._entries: set[bytes] = set()

    def usage(self, scope: str, body: dict[str, Any]) -> tuple[int, int, int]:
        """(uncached input, cache creation, cache read) tokens for this request, writing the
        prefixes at its breakpoints. A block counts as sent, without its cache marker (marking
        a block changes neither its size nor the prefix it ends)."""
        digest = hashlib.sha256(scope.encode()).digest()
        prefixes: list[tuple[bytes, int, bool]] = []  # (digest, tokens so far, breakpoint)
        total = 0
        for role, block in _prompt_blocks(body):
            bare = {k: v for k, v in block.items() if k != "cache_control"}
            total += count_text_tokens(role) + count_text_tokens(orjson.dumps(bare).decode())
            digest = hashlib.sha256(
                digest + orjson.dumps([role, bare], option=orjson.OPT_SORT_KEYS)
            ).digest()
            prefixes.append((digest, total, "cache_control" in block))
        breakpoints = [i for i, (_, _, marked) in enumerate(prefixes) if marked]
        read = 0
        for b in breakpoints:
            for i in range(b, max(-1, b - LOOKBACK_BLOCKS - 1), -1):
                found, tokens, _ = prefixes[i]
                if found in self._entries and tokens > read:
                    read = tokens
                    break
        written = 0
        for b in breakpoints:
            found, tokens, _ = prefixes[b]
            if tokens >= MIN_CACHEABLE_TOKENS:
                self._entries.add(found)
                written = max(written, tokens)
        creation = max(0, written - read)
        return total - read - creation, creation, read


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
