"""The one way this project calls a model: `litellm.acompletion`, wrapped in our retry policy.

litellm's own retries are off (`num_retries=0`): every retry is decided by `llm/retry.py`, and
every wait is reported before it starts, so the agent's budget clock can keep it off the query's
charged time. Key values are read from the environment at call time and scrubbed from any error
text we keep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import litellm
import orjson

from piserini_ray.config import ModelConfig, RetryConfig
from piserini_ray.errors import InfrastructureError
from piserini_ray.llm.retry import (
    Failure,
    FailureKind,
    RetryError,
    classify,
    note_reply_body,
    retrying,
)
from piserini_ray.llm.secrets import scrub
from piserini_ray.llm.usage import usage_from_response, usage_reported
from piserini_ray.records import Usage

litellm.suppress_debug_info = True


class Limiter(Protocol):
    """Admission control before each attempt (the cluster-wide rate limiter implements it)."""

    async def acquire(self, estimated_tokens: int, max_output: int | None = None) -> str:
        """Wait for a slot for a call with a prompt of about `estimated_tokens` and at most
        `max_output` completion tokens (None: unbounded); returns the grant's ticket, which
        `report` gives back. Raises `RequestTooLarge` for a call no quota window can hold."""
        ...

    def report(
        self, ticket: str, failure: Failure | None, used: tuple[int, int] | None = None
    ) -> None:
        """The call ended: `used` is (prompt, completion) tokens as the provider counted them."""
        ...


class WaitTracker(Protocol):
    """Where waits are recorded: the agent's budget clock keeps them off the charged time.

    `waiting` is entered *before* a wait starts (with its expected length when known) and left
    when it ends.
    """

    def waiting(self, expected: float | None, why: str) -> AbstractContextManager[None]: ...


class _NoTracker:
    """Waits outside any budget (a judge call, a script): nothing to record them on."""

    def waiting(self, expected: float | None, why: str) -> AbstractContextManager[None]:
        return nullcontext()


@dataclass
class Completion:
    """One successful model call and what it cost."""

    message: dict[str, Any]  # the assistant message as it goes back into the history
    content: str | None
    tool_calls: list[dict[str, Any]]
    usage: Usage
    model_seconds: float  # time inside HTTP attempts (charged)
    waited_seconds: float  # back-off and limiter time (not charged)
    attempts: int
    failures: list[str] = field(default_factory=list)
    usage_reported: bool = True  # False: the reply had no usage block (its tokens are unknown)
    reasoning: str | None = None  # the reasoning text the provider returned, if any


class LLMClient:
    def __init__(
        self,
        model: ModelConfig,
        retry: RetryConfig = RetryConfig(),
        api_base: str | None = None,
        limiter: Limiter | None = None,
        seed: int | None = None,
    ) -> None:
        self.model = model
        self.retry = retry
        self.api_base = api_base or model.api_base
        self.limiter = limiter
        self._rng = random.Random(seed)

    def _api_key(self) -> str | None:
        name = self.model.api_key_env
        if name is None:
            # A self-hosted endpoint (the loopback provider, vLLM, ...) needs no secret but the
            # OpenAI client insists on one; a hosted provider's key comes from litellm's own
            # environment variables (OPENAI_API_KEY, ...).
            return "no-key" if self.api_base else None
        value = os.environ.get(name)
        if not value:
            raise RetryError(
                Failure(
                    FailureKind.PERMANENT,
                    f"environment variable {name} (model.api_key_env) is not set",
                ),
                attempts=0,
            )
        return value

    def scrub(self, text: str) -> str:
        """Remove every key value this process could send from text we are about to keep."""
        name = self.model.api_key_env
        return scrub(text, [os.environ.get(name) if name else None])

    def _params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model.resolved_litellm_model(),
            "timeout": self.model.call_timeout,
            "num_retries": 0,
        }
        if self.api_base:
            params["api_base"] = self.api_base
        if self.model.temperature is not None:
            params["temperature"] = self.model.temperature
        if self.model.max_output_tokens is not None:
            params["max_tokens"] = self.model.max_output_tokens
        if self.model.reasoning_effort is not None:
            params["reasoning_effort"] = self.model.reasoning_effort
        if self.model.prompt_caching == "auto" and self.provider == "anthropic":
            # Anthropic caches only marked prefixes: the system prompt (shared by every query)
            # and the conversation's last message, which moves each turn; the next request
            # finds the previous prefix within the 20 blocks Anthropic looks back. Two of the
            # four breakpoints it allows; litellm puts them on the converted blocks.
            params["cache_control_injection_points"] = [
                {"location": "message", "role": "system"},
                {"location": "message", "index": -1},
            ]
        return params | self.model.extra

    @functools.cached_property
    def provider(self) -> str:
        """litellm's provider of the route (`openai`, `anthropic`, `deepseek`, ...), resolved
        once: every call of a client asks."""
        try:
            return str(litellm.get_llm_provider(self.model.resolved_litellm_model())[1])
        except Exception:  # an unknown route: litellm says so on the first call
            return "unknown"

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        waits: WaitTracker | None = None,
        response_format: dict[str, Any] | None = None,
        estimated_tokens: int = 0,
    ) -> Completion:
        """One logical call with classified retries. Raises `RetryError` when it fails for good."""
        api_key = self._api_key()
        params = self._params()
        if tools:
            params["tools"] = tools
        if response_format is not None:
            params["response_format"] = response_format
        tracker = waits or _NoTracker()
        # Quotas count tokens before the provider does: ~4 characters a token is close enough.
        estimated_tokens = estimated_tokens or len(orjson.dumps(messages)) // 4
        model_seconds = waited = 0.0
        failures: list[str] = []
        attempts = 0

        def on_wait(seconds: float, failure: Failure) -> None:
            failures.append(
                f"{failure.kind.value}, waiting {seconds:.2f} s: "
                + self.scrub(failure.reason)[:400]
            )

        async def sleep(seconds: float) -> None:
            nonlocal waited
            started = time.monotonic()
            with tracker.waiting(seconds, "back-off"):
                await asyncio.sleep(seconds)
            waited += time.monotonic() - started

        async def attempt() -> Any:
            nonlocal model_seconds, attempts, waited
            attempts += 1
            ticket = ""
            if self.limiter is not None:
                started = time.monotonic()
                with tracker.waiting(None, "rate limiter"):
                    ticket = await self.limiter.acquire(
                        estimated_tokens, self.model.max_output_tokens
                    )
                waited += time.monotonic() - started
            started = time.monotonic()
            failure: Failure | None = Failure(FailureKind.TRANSIENT, "cancelled")
            used: tuple[int, int] | None = None
            logged: list[object] = []  # the raw reply litellm logs before parsing it
            try:
                response = await litellm.acompletion(
                    messages=messages, api_key=api_key, **params, logger_fn=_reply_log(logged)
                )
                failure = None
                if usage_reported(response):
                    usage = usage_from_response(response)
                    used = (usage.input_tokens, usage.output_tokens)
            except Exception as exc:
                if logged:  # a 200 whose body is an error object: the body decides
                    note_reply_body(exc, logged[-1])
                failure = classify(exc)
                raise
            finally:
                model_seconds += time.monotonic() - started
                if self.limiter is not None:  # also when cancelled: the slot must come back
                    self.limiter.report(ticket, failure, used)
            return response

        try:
            async for state in retrying(self.retry, on_wait, self._rng, sleep):
                with state:
                    response = await attempt()
        except InfrastructureError:
            raise  # the scheduler re-runs the query; it is no failure of the call
        except Exception as exc:
            failure = classify(exc)
            scrubbed = dataclasses.replace(failure, reason=self.scrub(failure.reason))
            raise RetryError(scrubbed, attempts, failures, model_seconds, waited) from None
        return _completion(response, model_seconds, waited, attempts, failures, self.provider)


def _reply_log(logged: list[object]) -> Callable[[dict[str, Any]], None]:
    """litellm's `logger_fn`: it is handed the provider's raw reply after the HTTP call and
    before the reply is parsed, which is the only place the body of a 200 carrying an error
    object is seen whole (litellm then raises with its message alone)."""

    def log(details: dict[str, Any]) -> None:
        if details.get("log_event_type") == "post_api_call":
            logged[:] = [details.get("original_response")]

    return log


def _completion(
    response: Any,
    model_seconds: float,
    waited: float,
    attempts: int,
    failures: list[str],
    provider: str,
) -> Completion:
    message = response.choices[0].message
    tool_calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments},
        }
        for call in (message.tool_calls or [])
    ]
    history_message: dict[str, Any] = {"role": "assistant", "content": message.content}
    if tool_calls:
        history_message["tool_calls"] = tool_calls
    # What the provider needs back on the next turn, kept as litellm returned it: Anthropic's
    # thinking blocks with their signatures (litellm puts them first in the assistant content;
    # without them a thinking model's tool loop is refused at turn 2) and DeepSeek's
    # `reasoning_content` (required back on tool-call turns in thinking mode).
    thinking = [dict(b) for b in getattr(message, "thinking_blocks", None) or []]
    reasoning = getattr(message, "reasoning_content", None)
    if thinking and provider == "anthropic":  # other routes send unknown keys as they are
        history_message["thinking_blocks"] = thinking
    if reasoning:
        history_message["reasoning_content"] = reasoning
    # OpenAI's Responses API (litellm's bridge for gpt-5.4+ with tools and a reasoning effort):
    # its reasoning items, which litellm sends back before the turn's function calls.
    items = getattr(message, "reasoning_items", None)
    if items and provider == "openai":
        history_message["reasoning_items"] = [dict(i) for i in items]
    return Completion(
        message=history_message,
        content=message.content,
        tool_calls=tool_calls,
        reasoning=reasoning
        or "\n".join(str(b.get("thinking")) for b in thinking if b.get("thinking"))
        or None,
        usage=usage_from_response(response),
        usage_reported=usage_reported(response),
        model_seconds=model_seconds,
        waited_seconds=waited,
        attempts=attempts,
        failures=failures,
    )
