"""What a wire format (Chat Completions, Anthropic Messages, OpenAI Responses, DeepSeek) is to the
offline provider's one request pipeline (`server.py`): a small codec.

The pipeline runs the same stages for every route (auth, parse, quota admission, latency,
policy, encode) and knows no wire format; a codec knows nothing else. It reads the
route's key header, decodes and validates its body (refusing what the real API refuses), shows
the request to the policies in the chat-completions shape they read, encodes their reply with
the usage that route bills, and renders every failure, the pipeline's included, as that
provider's error body and headers.

Failures are raised as a `Problem`: dialect-neutral (a kind, an optional explicit status, the
rate-limit windows), so a quota (or a fault the test kit injects through `hooks.py`) is
decided once and each codec says it in its provider's words.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web

from piserini_ray.offline.policy import PolicyReply

ProblemKind = Literal[
    "invalid_request",  # the request itself is refused (400 and other 4xx)
    "authentication",  # no key, or a bad one (401)
    "not_found",  # the model is not served (404)
    "rate_limit",  # a quota window is full, or a scripted 429 (retried after a wait)
    "quota_exhausted",  # no credit, a spend limit (never retried)
    "server_error",  # 5xx
    "overloaded",  # the provider is overloaded (OpenAI's 503, Anthropic's 529)
    "context_window",  # the prompt does not fit the model
]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # all of the prompt, cached parts included
    completion_tokens: int
    cached_tokens: int  # read from the cache
    cache_write_tokens: int = 0  # written to the cache (Anthropic's route)
    cache_write_1h_tokens: int = 0  # of which to the 1-hour cache


@dataclass(frozen=True)
class Window:
    """One quota window's state when a request was refused, for the rate-limit headers."""

    name: Literal["requests", "tokens"]
    limit: int
    remaining: int
    reset: float  # seconds until the window is fully replenished (its newest entry leaves)


class Problem(Exception):
    """A failure the pipeline answers with, in no provider's words yet (`Codec.error` renders it).

    `status`: None for the codec's own status for the kind (a seeded overload is OpenAI's 503
    and Anthropic's 529); an explicit one (a scripted `http_error`) is kept on every route.
    `message`: None for the codec's wording. `param` and `code`: OpenAI's `error.param` and
    `error.code` where the kind alone does not say them. `window` and `limits`: the quota window
    that refused the request (`requests`, `tokens`) and every configured window's state.
    `in_200`: the error object comes inside an HTTP 200, as when a failure happens after the
    status line went out.
    """

    def __init__(
        self,
        kind: ProblemKind,
        message: str | None = None,
        *,
        status: int | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after: str | None = None,
        window: Literal["requests", "tokens"] | None = None,
        limits: tuple[Window, ...] = (),
        detail: str | None = None,
        tokens: int | None = None,
        in_200: bool = False,
    ) -> None:
        super().__init__(message or kind)
        self.kind: ProblemKind = kind
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.window = window
        self.limits = limits
        self.detail = detail
        self.tokens = tokens
        self.in_200 = in_200


def refused(message: str, param: str | None = None, code: str | None = None) -> Problem:
    """A request the real API rejects: 400 `invalid_request_error`."""
    return Problem("invalid_request", message, param=param, code=code)


def decode_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object (every route, and a batch's body)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise refused(f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise refused("request body must be a JSON object")
    return body


@dataclass
class Parsed:
    """A request the codec accepted: its body, the model it names and its prompt size."""

    body: dict[str, Any]
    model: str
    #: Counts the prompt as the route bills it (only when a quota or an error needs it: it
    #: tokenizes the whole conversation).
    count_prompt: Callable[[], int] = field(repr=False)
    #: What the codec found while validating and needs again to encode (thinking on or off).
    options: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def prompt_tokens(self) -> int:
        return self.count_prompt()


@dataclass(frozen=True)
class Encoded:
    """A success body with what it bills (and the conversation it continues, when known)."""

    body: dict[str, Any]
    usage: Usage
    conversation: str | None = None


class Codec:
    """One wire format. Subclasses implement every method that raises `NotImplementedError`."""

    #: The route's name in logs.
    name = "codec"

    # -- auth -------------------------------------------------------------------------------

    def api_key(self, headers: Mapping[str, str]) -> str | None:
        """The key the request sends in this route's header, or None."""
        raise NotImplementedError

    def missing_key(self) -> Problem:
        """What the route answers when a key is required and none was sent."""
        raise NotImplementedError

    def check_headers(self, headers: Mapping[str, str]) -> None:
        """Raise `Problem` for a header the route requires (Anthropic's `anthropic-version`)."""

    # -- parse ------------------------------------------------------------------------------

    def decode(self, raw: bytes) -> dict[str, Any]:
        """The JSON object of the body; `Problem` when it is not one."""
        raise NotImplementedError

    def describe(
        self, body: dict[str, Any]
    ) -> tuple[str | None, list[Any] | None, list[Any] | None]:
        """(model, conversation, tools) as the request log keeps them, before validation."""
        raise NotImplementedError

    def validate(self, body: dict[str, Any]) -> Parsed:
        """The accepted request; `Problem` for what the real API rejects."""
        raise NotImplementedError

    def unknown_model(self, model: str, served: list[str]) -> Problem:
        raise NotImplementedError

    # -- policy and encode ------------------------------------------------------------------

    def policy_request(self, parsed: Parsed) -> dict[str, Any]:
        """The request in the chat-completions shape the policies read."""
        raise NotImplementedError

    def encode(self, parsed: Parsed, reply: PolicyReply, key_hash: str | None) -> Encoded:
        """The success body and its usage (updating the route's prompt cache)."""
        raise NotImplementedError

    def drop_usage(self, body: dict[str, Any]) -> None:
        """Remove the usage block (a scripted `no_usage` reply)."""
        body.pop("usage", None)

    def error(self, problem: Problem) -> web.Response:
        """The provider's error response for `problem`: status, body and headers."""
        raise NotImplementedError

    # -- state ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the route's caches (the provider's reset)."""
