"""The emulated provider's faults, in no wire format: seeded server errors and damaged replies
(`FaultRates`), and scripted behaviours (`Scripted`) as `Problem`s each route's codec renders.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable
from typing import Any

from piserini_ray.offline.codec import Problem, ProblemKind
from piserini_ray.offline.policy import PolicyReply, PolicyToolCall
from piserini_ray_testkit.settings import FaultRates, Scripted

#: Random faults, in the order they are drawn and tried (see `FaultRates`).
FAULT_ORDER = tuple(FaultRates.model_fields)
#: Statuses a seeded server error draws from (the draw is the same on every route; a codec
#: may say one in its own terms: OpenAI's 503 "overloaded" is Anthropic's 529).
SERVER_ERROR_STATUSES = (500, 502, 503)


def seeded_server_error(status: int) -> Problem:
    """The seeded `http_500` fault: a server error, or an overload for a 503."""
    if status == 503:
        return Problem("overloaded")
    return Problem("server_error", status=status)


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def scripted_problem(spec: Scripted, prompt_tokens: Callable[[], int]) -> Problem | None:
    """The failure that replaces the reply for a scripted kind, or None to answer normally
    (`prompt_tokens` counts the prompt, quoted by a context-window error)."""
    if spec.kind == "rate_limit":
        retry_after = None
        if spec.retry_after is not None and spec.retry_after_date:
            # An HTTP date has whole seconds: round up, so the client never waits too little.
            moment = math.ceil(time.time() + spec.retry_after)
            retry_after = email.utils.formatdate(moment, usegmt=True)
        elif spec.retry_after is not None:
            retry_after = _format_seconds(spec.retry_after)
        return Problem(
            "rate_limit",
            spec.message or "Rate limit reached for requests (scripted).",
            retry_after=retry_after,
        )
    if spec.kind == "resource_unavailable":
        return Problem(
            "overloaded",
            spec.message or "Resource unavailable: flex processing has no capacity right now.",
            status=429,
            code="resource_unavailable",
        )
    if spec.kind == "insufficient_quota":
        return Problem("quota_exhausted", spec.message)
    if spec.kind == "http_error":
        kind: ProblemKind = "server_error" if spec.status >= 500 else "invalid_request"
        # A status the codecs have their own words for keeps them; any other says what it is.
        standard = spec.status in SERVER_ERROR_STATUSES
        message = spec.message or (None if standard else f"HTTP {spec.status} (scripted)")
        return Problem(kind, message, status=spec.status)
    if spec.kind == "error_body":
        return Problem(
            "server_error",
            spec.message or "The server had an error processing your request.",
            status=200,
            in_200=True,
        )
    if spec.kind == "auth_error":
        return Problem("authentication", spec.message or "Incorrect API key provided (scripted).")
    if spec.kind == "bad_request":
        return Problem("invalid_request", spec.message or "Bad request (scripted).")
    if spec.kind == "context_window":
        return Problem("context_window", tokens=prompt_tokens())
    return None


def _tool_names(tools: list[Any] | None) -> set[str]:
    names = set()
    for tool in tools or ():
        if isinstance(tool, dict):
            name = (tool.get("function") or {}).get("name")
            if isinstance(name, str):
                names.add(name)
    return names


def _required_fields(tools: list[Any] | None, name: str) -> list[str]:
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            required = (function.get("parameters") or {}).get("required") or []
            return [r for r in required if isinstance(r, str)]
    return []


def _truncate_json(text: str) -> str:
    """A prefix of `text` that is not valid JSON (as a reply cut off mid-stream looks)."""
    cut = text[: max(1, len(text) // 2)]
    try:
        json.loads(cut)
    except ValueError:
        return cut
    return cut + '{"'  # still valid (e.g. a short number): make sure it is not


def apply_reply_fault(
    reply: PolicyReply, kind: str, tools: list[Any] | None
) -> tuple[PolicyReply, bool]:
    """Damage the reply as `kind` says (`tools`: the request's, in the chat-completions shape);
    (reply, whether the fault applied)."""
    if kind == "empty_reply":
        return PolicyReply(content="", tool_calls=[]), True
    if not reply.tool_calls:
        return reply, False
    first, rest = reply.tool_calls[0], reply.tool_calls[1:]
    if kind == "malformed_arguments":
        damaged = first.model_copy(update={"arguments": _truncate_json(first.arguments)})
    elif kind == "unknown_tool":
        known, name, n = _tool_names(tools) | {first.name}, "web_browse", 1
        while name in known:
            n += 1
            name = f"web_browse_{n}"
        damaged = first.model_copy(update={"name": name})
    elif kind == "missing_fields":
        try:
            arguments = json.loads(first.arguments)
        except ValueError:
            return reply, False
        if not isinstance(arguments, dict) or not arguments:
            return reply, False
        candidates = ["reason", *_required_fields(tools, first.name), *arguments]
        drop = next(c for c in candidates if c in arguments)
        del arguments[drop]
        damaged = first.model_copy(update={"arguments": json.dumps(arguments)})
    else:
        raise ValueError(f"unknown reply fault {kind!r}")
    tool_calls: list[PolicyToolCall] = [damaged, *rest]
    return reply.model_copy(update={"tool_calls": tool_calls}), True
