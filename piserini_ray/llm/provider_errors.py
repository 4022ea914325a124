"""What the provider sent when an LLM call failed, read from the exception litellm raised
(`provider_reply`: the status, headers and JSON body of the HTTP response behind it, or the
error object of a 200 reply litellm refused), and the structured fields of that reply that
the catalogue reads (`error_shape`). No message text is ever read.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class ProviderReply:
    """What the provider answered to a failed call, as far as the exception shows it."""

    status: int
    headers: Mapping[str, str]  # names in lower case
    body: Any  # the JSON body, or None (not JSON, or not known)
    #: `http`: the error response itself; `error_in_200`: a 200 whose body is an error object
    #: (litellm refuses it and keeps only its message); `provider_status`: only the status
    #: litellm's provider layer reported, with no HTTP error response behind it (an `error`
    #: event inside a stream, which litellm reports as a 500).
    source: Literal["http", "error_in_200", "provider_status"]


#: Where `note_reply_body` leaves a 200 reply's error object on the exception.
_REPLY_BODY = "_piserini_reply_body"


#: Failures in which nothing came back (a refused connection, a time-out); with httpx's and
#: the OpenAI SDK's transport errors, added where those are imported.
_NO_REPLY: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


def note_reply_body(exc: BaseException, logged: object) -> None:
    """Keep on `exc` the body of a 200 reply that litellm refused because it carries an error
    object (OpenRouter and OpenAI-compatible servers answer so): litellm keeps only the
    error's message, and the body is what decides. `logged` is the raw reply litellm handed
    its `logger_fn` before parsing it (a JSON string, or already a dict)."""
    body = _json(logged)
    if isinstance(body, dict) and body.get("error"):
        with contextlib.suppress(AttributeError):  # a type that takes no attributes
            setattr(exc, _REPLY_BODY, body)


def provider_reply(exc: BaseException) -> ProviderReply | None:
    """The provider's reply behind `exc`, read from the exceptions litellm raised from (it
    raises inside `except`, so the HTTP error with the real response is on the chain), else
    from a 200 body `note_reply_body` kept, else from the status litellm's provider layer
    reported; None when no reply is known."""
    import httpx
    import openai
    from litellm.llms.base_llm.chat.transformation import BaseLLMException

    no_reply = (*_NO_REPLY, httpx.TransportError, openai.APIConnectionError)

    chain = list(_chain(exc))
    for error in chain:
        response: httpx.Response | None = None
        if isinstance(error, httpx.HTTPStatusError):
            response = error.response
        elif isinstance(error, openai.APIStatusError) and not _is_litellms(error):
            response = error.response  # the OpenAI SDK's own error: the real response
        if response is not None:
            return ProviderReply(
                response.status_code,
                lower_headers(response.headers),
                _json(_content(response)),
                "http",
            )
    for error in chain:
        body = getattr(error, _REPLY_BODY, None)
        if body is not None:
            return ProviderReply(200, {}, body, "error_in_200")
    if any(isinstance(error, no_reply) for error in chain):
        return None  # nothing came back: litellm's status for it is made up
    for error in chain:
        status = getattr(error, "status_code", None)
        if (
            isinstance(error, BaseLLMException)
            and isinstance(status, int)
            and not getattr(error, "status_code_is_synthesized", False)
        ):
            return ProviderReply(status, lower_headers(error.headers), None, "provider_status")
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 32:
        error = todo.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        for nxt in (
            getattr(error, "original_exception", None),  # litellm's MidStreamFallbackError
            error.__cause__,
            error.__context__,
        ):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def _is_litellms(error: BaseException) -> bool:
    """litellm's own exception classes subclass the OpenAI SDK's with a made-up response."""
    return type(error).__module__.split(".")[0] == "litellm"


def _content(response: Any) -> bytes | None:
    try:
        return bytes(response.content)
    except Exception:  # a streamed response never read
        return None


def _json(raw: object) -> Any:
    if isinstance(raw, dict | list):
        return raw
    if not isinstance(raw, str | bytes) or not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def lower_headers(headers: object) -> dict[str, str]:
    """Response headers as a plain dict, names in lower case ({} for anything else)."""
    if not isinstance(headers, Mapping):
        return {}
    items = headers.multi_items() if hasattr(headers, "multi_items") else headers.items()
    return {str(k).lower(): str(v) for k, v in items}


# ---------------------------------------------------------------- the fields that decide


@dataclass(frozen=True)
class ErrorShape:
    """The structured fields of a provider's error reply that the catalogue reads."""

    #: The HTTP status, except for an error object inside a 200 whose `code` is an HTTP status
    #: (OpenRouter: "the same status code as error.code"): that code.
    status: int
    http_status: int
    source: str
    type: str | None = None  # error.type (OpenAI, DeepSeek, Anthropic)
    code: str | None = None  # error.code (OpenAI's string codes; OpenRouter's and Gemini's ints)
    grpc_status: str | None = None  # error.status (Gemini's google.rpc code name)
    detail_code: str | None = None  # error.details.error_code (Anthropic)
    #: Gemini's `QuotaFailure` violations: (quotaId or quotaMetric, quotaValue).
    quotas: tuple[tuple[str, str | None], ...] = ()
    retry_delay: float | None = None  # Gemini's `RetryInfo.retryDelay`, in seconds
    #: The response headers, with OpenRouter's `error.metadata.headers` beneath them.
    headers: Mapping[str, str] = field(default_factory=dict)


def error_shape(reply: ProviderReply) -> ErrorShape:
    body = reply.body
    if isinstance(body, list) and body:  # Gemini may answer with a list of one error
        body = body[0]
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = error.get("code")
    details = error.get("details")
    quotas: list[tuple[str, str | None]] = []
    retry_delay = None
    for detail in details if isinstance(details, list) else []:
        kind = str(detail.get("@type", "")) if isinstance(detail, dict) else ""
        if kind.endswith("google.rpc.QuotaFailure"):
            for violation in detail.get("violations") or []:
                if isinstance(violation, dict):
                    name = violation.get("quotaId") or violation.get("quotaMetric") or ""
                    value = violation.get("quotaValue")
                    quotas.append((str(name), None if value is None else str(value)))
        elif kind.endswith("google.rpc.RetryInfo"):
            retry_delay = parse_duration(str(detail.get("retryDelay", "")))
    headers = dict(reply.headers)
    metadata = error.get("metadata")
    if isinstance(metadata, dict):
        headers = lower_headers(metadata.get("headers")) | headers
    status = reply.status
    if reply.source == "error_in_200":
        status = _as_status(code) or status
    return ErrorShape(
        status=status,
        http_status=reply.status,
        source=reply.source,
        type=_str(error.get("type")),
        code=_str(code),
        grpc_status=_str(error.get("status")),
        detail_code=_str(details.get("error_code")) if isinstance(details, dict) else None,
        quotas=tuple(quotas),
        retry_delay=retry_delay,
        headers=headers,
    )


def _str(value: object) -> str | None:
    return None if value is None or isinstance(value, dict | list) else str(value)


def _as_status(code: object) -> int | None:
    if isinstance(code, bool):
        return None
    if isinstance(code, int) or (isinstance(code, str) and code.isdigit()):
        status = int(code)
        return status if 100 <= status <= 599 else None
    return None


def parse_duration(value: str) -> float | None:
    """Seconds in a Go-style duration (`1s`, `6m0s`, `20ms`, `1h2m3.5s`: OpenAI's reset
    headers) or a protobuf one (`46s`, `0.5s`: Gemini's `retryDelay`); None if neither."""
    value = value.strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)
