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
import socket
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import litellm
import orjson
from pydantic import SecretStr

from piserini_ray.config import ModelConfig, RetryConfig
from piserini_ray.errors import InfrastructureError
from piserini_ray.llm.batches import chat_body
from piserini_ray.llm.error_catalogue import classify
from piserini_ray.llm.failures import Failure, FailureKind, RetryError
from piserini_ray.llm.provider_errors import note_reply_body
from piserini_ray.llm.retry import retrying
from piserini_ray.llm.routes import route_facts, route_provider
from piserini_ray.llm.scrubber import hold, scrub
from piserini_ray.llm.usage import (
    ReportedPrompts,
    character_estimate,
    estimate_prompt,
    usage_from_response,
    usage_reported,
)
from piserini_ray.records import Usage

litellm.suppress_debug_info = True


class Batcher(Protocol):
    """Where a model at `service_tier: batch` sends each call (`llm/batcher.TurnBatcher`)."""

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]: ...


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
    finish_reason: str | None = None  # why the reply ended, as the provider said


@dataclass
class CallTrace:
    """One call as it goes, kept up to date for a caller that may cancel it (the agent's
    budget) or see it fail: what it went through, and, when it ended with no usage after its
    request reached the provider, that request's prompt as counted here (`estimate`)."""

    attempts: int = 0
    model_seconds: float = 0.0  # time inside HTTP attempts
    waited_seconds: float = 0.0  # back-off and limiter time
    failures: list[str] = field(default_factory=list)
    #: The last request that went out is with the provider (cut in flight), or failed there
    #: (`reached_provider`: a server error, an error object in its reply, a time-out or a
    #: connection lost after sending), and no usage came back for it: it may be billed.
    unreported: bool = False
    #: That request's prompt tokens (`input_tokens` = `estimated_input_tokens`), priced as
    #: input; set when the call was cut or failed with `unreported` true.
    estimate: Usage | None = None
    #: How `estimate` was counted (`usage.estimate_prompt`): `tokenizer <name>` or
    #: `characters / 4`, and how the provider's last reported count calibrated it.
    estimate_method: str | None = None


def reached_provider(exc: BaseException, failure: Failure, sent: bool) -> bool:
    """Whether a failed attempt's request got to the provider, which may bill it: a transient
    failure (a 5xx or 529, an error object in a 200, a time-out waiting for the reply, a
    connection lost after sending) of a request that went out (litellm said it sends it, `sent`;
    or a reply came back; or the failure is one of waiting for a reply). A rate limit, a quota
    and a client error (400-404) were refused at the door; a connection that never opened, or
    a failure on this side before sending, delivered nothing."""
    if failure.kind is not FailureKind.TRANSIENT:
        return False
    import httpx
    import openai

    never_delivered: tuple[type[BaseException], ...] = (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.PoolTimeout,
        ConnectionRefusedError,
        socket.gaierror,
    )
    awaiting_reply: tuple[type[BaseException], ...] = (
        httpx.ReadTimeout,
        httpx.ReadError,
        httpx.RemoteProtocolError,
        openai.APITimeoutError,
        TimeoutError,
        ConnectionResetError,
    )
    went_out = sent or failure.status is not None
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 32:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        name = type(error).__name__  # aiohttp's (litellm's transport), not imported here
        if isinstance(error, never_delivered) or name == "ClientConnectorError":
            return False
        if isinstance(error, awaiting_reply) or name in _AIOHTTP_AWAITING_REPLY:
            went_out = True
        for nxt in (getattr(error, "original_exception", None), error.__cause__, error.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return went_out


#: aiohttp's failures while waiting for a reply to a request it sent.
_AIOHTTP_AWAITING_REPLY = frozenset(
    {"ServerDisconnectedError", "ServerTimeoutError", "SocketTimeoutError", "ClientPayloadError"}
)


@dataclass
class _Request:
    """One logical call's request, as each of its attempts sends it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: dict[str, Any]  # litellm's arguments besides the messages and the key
    api_key: str | None
    estimated_tokens: int  # what the limiter reserves for the prompt


class LLMClient:
    def __init__(
        self,
        model: ModelConfig,
        retry: RetryConfig = RetryConfig(),
        api_base: str | None = None,
        limiter: Limiter | None = None,
        seed: int | None = None,
        keys: Mapping[str, SecretStr] | None = None,
        request_seed: int | None = None,
        batcher: Batcher | None = None,
    ) -> None:
        """`keys`: key values by variable name, handed over by the driver (`secrets.driver_keys`);
        a variable missing there is read from this process's environment. `request_seed`: sent
        as the `seed` parameter where litellm's route takes one (an epoch's seed); `seed`
        only seeds the back-off's jitter."""
        self.model = model
        self.retry = retry
        self.api_base = api_base or model.api_base
        self.limiter = limiter
        self._rng = random.Random(seed)
        #: The requests whose prompts the provider reported: what calibrates the estimate of
        #: an unreported one (`_estimate`).
        self.reported = ReportedPrompts()
        self._keys = dict(keys or {})
        #: The variables its calls read (`routes.route_facts`): keys, and for Azure or Bedrock
        #: endpoint, version, region and credentials.
        self.facts = route_facts(model, self.api_base)
        # Every secret this client could send is scrubbed from what this process writes.
        hold(*self._secrets())
        self.request_seed = request_seed
        #: `service_tier: batch`: every call goes through it, as a line of a provider batch.
        self.batcher = batcher

    def move(self, api_base: str) -> None:
        """The endpoint moved (a served model's server, lost, placed again elsewhere): every
        next attempt goes to `api_base`, those of the calls in flight included."""
        self.api_base = api_base

    def _value(self, name: str) -> str | None:
        """A variable's value: the driver's handed one, else this process's."""
        handed = self._keys.get(name)
        return handed.get_secret_value() if handed is not None else os.environ.get(name)

    def _secrets(self) -> list[str | None]:
        return [self._value(name) for name in self.facts.variables if self.facts.secret(name)]

    def api_key(self) -> str | None:
        """The key this client sends: the driver's handed value, else this process's variable
        (a loopback endpoint needs none)."""
        names = self.facts.key_variables
        if not names:
            # A self-hosted endpoint (the loopback provider, vLLM, a replica's relay to it)
            # needs no secret but the OpenAI client insists on one; a route whose credentials
            # are not an API key (Bedrock's) sends them as its own parameters (`_params`).
            return "no-key" if self.api_base else None
        for name in names:
            if value := self._value(name):
                hold(value)
                return value
        if self.model.api_key_env is None:
            return None  # litellm's own lookup, and its own error
        # A configuration failure, never a query's: the run stops (every query would fail).
        raise RetryError(
            Failure(
                FailureKind.PERMANENT,
                f"environment variable {names[0]} (model.api_key_env) is not set on this node "
                "and the driver handed no value for it: export it where you run piserini-ray",
                stops_run=True,
            ),
            attempts=0,
        )

    def scrub(self, text: str) -> str:
        """Remove every key value this process could send from text we are about to keep."""
        return scrub(text, self._secrets())

    def _params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model.resolved_litellm_model(),
            "timeout": self.model.call_timeout,
            "num_retries": 0,
        }
        # What the driver handed beyond the key (Azure's endpoint and version, Bedrock's
        # credentials and region): a node without the user's environment reads none of it.
        for name in self._keys:
            parameter = self.facts.parameter(name)
            if parameter is not None and parameter != "api_key" and name in self.facts.variables:
                params[parameter] = self._keys[name].get_secret_value()
        if self.api_base:
            params["api_base"] = self.api_base
        if self.model.temperature is not None:
            params["temperature"] = self.model.temperature
        if self.model.max_output_tokens is not None:
            params["max_tokens"] = self.model.max_output_tokens
        if self.model.reasoning_effort is not None:
            params["reasoning_effort"] = self.model.reasoning_effort
        if self.request_seed is not None and self.takes_seed:
            params["seed"] = self.request_seed
        if self.model.service_tier == "flex":
            params["service_tier"] = "flex"  # OpenAI's; preflight allows it on that route only
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
    def takes_seed(self) -> bool:
        """Whether litellm's route sends a `seed` parameter (OpenAI's and compatible routes do;
        Anthropic's has none, and litellm would refuse the call)."""
        try:
            supported = litellm.get_supported_openai_params(
                model=self.model.resolved_litellm_model(), custom_llm_provider=self.provider
            )
        except Exception:
            return False
        return "seed" in (supported or [])

    @functools.cached_property
    def provider(self) -> str:
        """`route_provider` of the client's model, resolved once: every call asks."""
        return route_provider(self.model)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        waits: WaitTracker | None = None,
        response_format: dict[str, Any] | None = None,
        estimated_tokens: int = 0,
        trace: CallTrace | None = None,
    ) -> Completion:
        """One logical call with classified retries. Raises `RetryError` when it fails for good.

        `trace` follows the call as it goes. A call that is cancelled, or fails for good, after
        its last request reached the provider (`reached_provider`) with no usage back leaves
        that request's prompt in `trace.estimate` (`usage.estimate_prompt`: counted locally,
        calibrated by the provider's last reported count)."""
        if self.batcher is not None:
            return await self._complete_in_batch(messages, tools, waits, response_format, trace)
        params = self._params()
        if tools:
            params["tools"] = tools
        if response_format is not None:
            params["response_format"] = response_format
        request = _Request(
            messages,
            tools,
            params,
            self.api_key(),
            # Quotas count tokens before the provider does: ~4 characters a token is enough.
            estimated_tokens or len(orjson.dumps(messages)) // 4,
        )
        tracker = waits or _NoTracker()
        call = trace if trace is not None else CallTrace()
        on_wait = functools.partial(self._note_wait, call)
        sleep = functools.partial(self._back_off, call, tracker)
        try:
            async for state in retrying(self.retry, on_wait, self._rng, sleep):
                with state:
                    response = await self._attempt(request, call, tracker)
        except InfrastructureError:
            raise  # the scheduler re-runs the query; it is no failure of the call
        except asyncio.CancelledError:  # cut (the budget): the provider bills what it received
            await self._estimate(call, messages, tools)
            raise
        except Exception as exc:
            failure = classify(exc)
            scrubbed = dataclasses.replace(failure, reason=self.scrub(failure.reason))
            await self._estimate(call, messages, tools)
            raise RetryError(
                scrubbed, call.attempts, call.failures, call.model_seconds, call.waited_seconds
            ) from None
        return _completion(
            response,
            call.model_seconds,
            call.waited_seconds,
            call.attempts,
            call.failures,
            self.provider,
        )

    async def _attempt(self, request: _Request, call: CallTrace, tracker: WaitTracker) -> Any:
        """One attempt of a call: a slot from the limiter (waiting on it is recorded), the
        request, its usage noted; whether the provider received it is left on `call` (what a
        cut or failed call is billed for, `_estimate`). The slot goes back whatever happens."""
        call.attempts += 1
        ticket = ""
        if self.limiter is not None:
            started = time.monotonic()
            with tracker.waiting(None, "rate limiter"):
                ticket = await self.limiter.acquire(
                    request.estimated_tokens, self.model.max_output_tokens
                )
            call.waited_seconds += time.monotonic() - started
        started = time.monotonic()
        failure: Failure | None = Failure(FailureKind.TRANSIENT, "cancelled")
        used: tuple[int, int] | None = None
        logged: list[object] = []  # the raw reply litellm logs before parsing it
        sent: list[bool] = []  # litellm's `pre_api_call` says the request goes out now
        try:
            response = await litellm.acompletion(
                messages=request.messages,
                api_key=request.api_key,
                # The endpoint as it is now: a served model's server may have moved (`move`).
                **(request.params | ({"api_base": self.api_base} if self.api_base else {})),
                logger_fn=_reply_log(logged, lambda: sent.append(True)),
                # Our tools are functions, never MCP servers: without this, litellm's first
                # call with tools imports its MCP gateway (mcp, uvicorn: ~1 s of a replica's
                # first query) only to find none. litellm drops it before the request.
                _skip_mcp_handler=True,
            )
            failure = None
            call.unreported = False  # its usage is the reply's (or, if none, unknown)
            if usage_reported(response):
                usage = usage_from_response(response)
                used = (usage.input_tokens, usage.output_tokens)
                self.reported.note(request.messages, request.tools, usage.input_tokens)
        except asyncio.CancelledError:
            # Cut in flight (the budget): litellm sends within milliseconds of the call (a
            # route's `pre_api_call` is not always reported: the Responses bridge's is not),
            # so the provider has the request and may bill it.
            call.unreported = True
            raise
        except Exception as exc:
            if logged:  # a 200 whose body is an error object: the body decides
                note_reply_body(exc, logged[-1])
            failure = classify(exc)
            if reached_provider(exc, failure, bool(sent)):
                call.unreported = True
            elif sent or failure.status is not None:  # this request was refused
                call.unreported = False
            raise
        finally:
            call.model_seconds += time.monotonic() - started
            if self.limiter is not None:  # also when cancelled: the slot must come back
                self.limiter.report(ticket, failure, used)
        return response

    def _note_wait(self, call: CallTrace, seconds: float, failure: Failure) -> None:
        """A back-off is about to start: on record first (`retrying`'s `on_wait`)."""
        call.failures.append(
            f"{failure.kind.value}, waiting {seconds:.2f} s: " + self.scrub(failure.reason)[:400]
        )

    async def _back_off(self, call: CallTrace, tracker: WaitTracker, seconds: float) -> None:
        """Sleep a back-off, as waiting (never charged to a budget)."""
        started = time.monotonic()
        with tracker.waiting(seconds, "back-off"):
            await asyncio.sleep(seconds)
        call.waited_seconds += time.monotonic() - started

    async def _complete_in_batch(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        waits: WaitTracker | None,
        response_format: dict[str, Any] | None,
        trace: CallTrace | None,
    ) -> Completion:
        """One call as a line of the next provider batch: the time in the queue is waiting
        (never charged to a budget), the reply is parsed as a direct call's."""
        assert self.batcher is not None
        extra: dict[str, Any] = {}
        if tools:
            extra["tools"] = tools
        if response_format is not None:
            extra["response_format"] = response_format
        if self.request_seed is not None and self.takes_seed:
            extra["seed"] = self.request_seed
        call = trace if trace is not None else CallTrace()
        call.attempts += 1
        started = time.monotonic()
        with (waits or _NoTracker()).waiting(None, "batch queue"):
            reply = await self.batcher.complete(chat_body(self.model, list(messages), **extra))
        call.waited_seconds += time.monotonic() - started
        response = litellm.ModelResponse(**reply)
        return _completion(
            response, 0.0, call.waited_seconds, call.attempts, call.failures, self.provider
        )

    async def _estimate(
        self, call: CallTrace, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> None:
        """Put on `call` the prompt of its last request when the provider received it and
        reported nothing (`estimate_prompt`, in a thread: loading a tokenizer the first time
        takes a second)."""
        if not call.unreported:
            return
        # Set first, so that a cancel while the tokenizer counts still leaves an estimate.
        rough = character_estimate(messages, tools)
        call.estimate = Usage(input_tokens=rough, estimated_input_tokens=rough)
        call.estimate_method = "characters / 4 (cut while counting)"
        tokens, call.estimate_method = await asyncio.to_thread(
            estimate_prompt,
            self.model.resolved_litellm_model(),
            messages,
            tools,
            self.reported,
        )
        call.estimate = Usage(input_tokens=tokens, estimated_input_tokens=tokens)


def _reply_log(
    logged: list[object], on_send: Callable[[], None] | None = None
) -> Callable[[dict[str, Any]], None]:
    """litellm's `logger_fn`: it is handed the provider's raw reply after the HTTP call and
    before the reply is parsed, which is the only place the body of a 200 carrying an error
    object is seen whole (litellm then raises with its message alone). `on_send` is called at
    litellm's `pre_api_call`, just before the request goes out (after everything that can
    fail on this side: the request's translation, the SDK client and its key)."""

    def log(details: dict[str, Any]) -> None:
        event = details.get("log_event_type")
        if event == "pre_api_call" and on_send is not None:
            on_send()
        elif event == "post_api_call":
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
        finish_reason=getattr(response.choices[0], "finish_reason", None),
    )
