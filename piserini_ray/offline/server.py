"""The offline provider: an OpenAI-compatible chat-completions server on loopback.

The framework reaches it through litellm exactly as it reaches a real provider, so test suites and
rehearsal runs exercise the real client path (HTTP, retries, timeouts, usage accounting) at zero
cost. Replies come from policies (see `policy.py`); on the way the server applies, in this order:

1. request validation (401 missing key when required, 400 bad body / streaming, 404 model);
2. the next scripted behaviour queued with `OfflineProvider.script` (skips 3 and 5 when set);
3. per-key quotas (429 with `Retry-After`);
4. latency (`asyncio.sleep`, so concurrent requests overlap);
5. random faults drawn from a seeded RNG (server errors, hangs, damaged replies);
6. the policy, then usage with prefix-cache accounting.

Prefix caching, shaped like real providers' (whose prompt starts with the tool definitions): the
cacheable prefix of a request is its `tools`, then its messages, whole items only. A
conversation is identified by a hash of the model and its first two messages (system + first
user, typically); `cached_tokens` is the token count of the longest leading run of (tools,
messages...) shared with the most recent earlier successful request of that conversation. A
first request still hits the cache for tools + system message when any earlier request of the
same model started the same way (the shared system prompt, as on a real provider). The reply
priming is never cached, so `cached_tokens < prompt_tokens` always holds. On the OpenAI route
the shared prefix is billed in OpenAI's steps (none under 1,024 tokens, then multiples of 128
above that, as on the Responses route); on DeepSeek's, whole messages (its prefix units).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import itertools
import json
import logging
import math
import os
import random
import signal
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from aiohttp import web

from piserini_ray.config.offline import REPLY_FAULTS, OfflineConfig, Scripted
from piserini_ray.offline import anthropic, deepseek, responses
from piserini_ray.offline.policy import Policy, PolicyReply, PolicyToolCall, reasoning_text
from piserini_ray.offline.tokens import (
    count_completion_tokens,
    count_message_tokens,
    count_prompt_tokens,
    count_text_tokens,
)

log = logging.getLogger(__name__)

#: Context length quoted by scripted `context_window` errors.
CONTEXT_WINDOW = 128_000
#: Conversations remembered for prefix caching; the least recently used are forgotten first.
MAX_CONVERSATIONS = 10_000
#: Random faults, in the order they are drawn and tried (see `FaultRates`).
_FAULT_ORDER = (
    "http_500",
    "hang",
    "empty_reply",
    "malformed_arguments",
    "unknown_tool",
    "missing_fields",
)
_SERVER_ERRORS = {
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The engine is currently overloaded, please try again later.",
}


def default_policies() -> dict[str, Policy]:
    """The built-in registry: the offline judges and, once they exist, the heuristic and its
    long-horizon variant.

    The heuristic agent is imported here, not at module level, so that this module does not
    depend on it (and importing it stays cheap until a server is built).
    """
    from piserini_ray.offline.judge_policy import JUDGES

    policies: dict[str, Policy] = dict(JUDGES)
    try:
        from piserini_ray.offline.heuristic import heuristic_policy
    except ModuleNotFoundError as error:
        if error.name != "piserini_ray.offline.heuristic":
            raise
        log.warning("piserini_ray.offline.heuristic is missing; offline/heuristic not served")
    else:
        policies["offline/heuristic"] = heuristic_policy
        from piserini_ray.offline.long_horizon import long_horizon_policy

        policies["offline/long-horizon"] = long_horizon_policy
    return policies


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # all of the prompt, cached parts included
    completion_tokens: int
    cached_tokens: int  # read from the cache
    cache_write_tokens: int = 0  # written to the cache (Anthropic's route)


@dataclass
class RecordedRequest:
    """One chat request as the server saw it; the API key only as a hash prefix."""

    seq: int
    model: str | None = None
    messages: list[Any] | None = None
    tools: list[Any] | None = None
    #: HTTP status returned; None when no response was sent (client gone or server stopped).
    status: int | None = None
    usage: Usage | None = None
    #: Fault or scripted kind applied (e.g. "http_500", "rate_limit"), None for a normal reply.
    fault: str | None = None
    scripted: bool = False
    key_hash: str | None = None
    conversation: str | None = None
    #: Seconds the server waited before answering (latency, scripted latency or hang).
    delayed: float = 0.0
    #: Chat requests being handled when this one arrived, itself included.
    concurrent: int = 0


def key_hash(key: str) -> str:
    """The 12-hex-digit SHA-256 prefix that stands for an API key in records and logs."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _error(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


@dataclass
class _Window:
    """Admitted requests of one key: deque of [monotonic time, tokens]."""

    entries: deque[list[float]] = field(default_factory=deque)


class _App:
    """The request handling, shared state and RNGs; runs on the server thread's event loop."""

    def __init__(self, config: OfflineConfig, policies: dict[str, Policy]) -> None:
        self.config = config
        self.policies = dict(policies)
        self.lock = threading.Lock()  # guards everything below against the test thread
        # The most recent requests only: each holds its whole conversation, so keeping all of a
        # long rehearsal's (21,000 requests of 40-call conversations) would take gigabytes.
        self.records: deque[RecordedRequest] = deque(maxlen=config.request_log)
        self.script: deque[Scripted] = deque()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._seq = itertools.count(1)
        self.signer = anthropic.Signer(os.urandom(32))
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.records.clear()
            self.script.clear()
            self.conversations: OrderedDict[str, list[bytes]] = OrderedDict()
            self.heads: set[str] = set()
            self.windows: dict[str, _Window] = {}
            self.prompt_caches: dict[str, anthropic.PromptCache] = {}
            self.prefix_caches: dict[str, responses.PrefixCache] = {}
            # Separate streams, so enabling latency does not shift the fault pattern.
            self.fault_rng = random.Random(f"{self.config.seed}:faults")
            self.latency_rng = random.Random(f"{self.config.seed}:latency")

    # -- aiohttp handlers ---------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        if self.config.require_key and _bearer_key(request) is None:
            return _missing_key()
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "piserini-ray-offline"}
            for name in self.policies
        ]
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.Response:
        return await self._serve_chat(request, deepseek_dialect=False)

    async def deepseek_chat(self, request: web.Request) -> web.Response:
        """DeepSeek's chat API: the OpenAI shape with its thinking-mode rules and usage
        fields (`offline/deepseek.py`)."""
        return await self._serve_chat(request, deepseek_dialect=True)

    async def _serve_chat(self, request: web.Request, deepseek_dialect: bool) -> web.Response:
        task = asyncio.current_task()
        assert task is not None
        record = RecordedRequest(seq=next(self._seq))
        self.tasks.add(task)
        record.concurrent = len(self.tasks)
        try:
            response = await self._chat(request, record, deepseek_dialect)
            record.status = response.status
            return response
        finally:
            self.tasks.discard(task)
            with self.lock:
                self.records.append(record)
            log.debug(
                "chat model=%s status=%s fault=%s key=%s",
                record.model,
                record.status,
                record.fault,
                record.key_hash,
            )

    # -- the pipeline -------------------------------------------------------------------------

    async def _chat(
        self, request: web.Request, record: RecordedRequest, deepseek_dialect: bool = False
    ) -> web.Response:
        key = _bearer_key(request)
        record.key_hash = key_hash(key) if key is not None else None
        if self.config.require_key and key is None:
            return _missing_key()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as error:
            return _error(400, f"request body is not valid JSON: {error}", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "invalid_request_error")
        model, messages, tools = body.get("model"), body.get("messages"), body.get("tools")
        record.model = model if isinstance(model, str) else None
        record.messages = messages if isinstance(messages, list) else None
        record.tools = tools if isinstance(tools, list) else None
        problem = _validate(body)
        if problem is not None:
            param, problem_text = problem
            return _error(400, problem_text, "invalid_request_error", param=param)
        # `_validate` checked the shapes: a model name and a list of message objects.
        model, messages = str(model), cast(list[dict[str, Any]], messages)
        if body.get("stream"):
            return _error(
                400,
                "streaming is not supported by the offline provider; send stream: false",
                "invalid_request_error",
                code="unsupported_value",
                param="stream",
            )
        if deepseek_dialect and (refused := deepseek.problem(body)) is not None:
            return _error(400, refused, "invalid_request_error")
        policy = self._policy(model)
        if policy is None:
            known = ", ".join(sorted(self.policies))
            return _error(
                404,
                f"The model `{model}` does not exist on the offline provider (serving: {known})",
                "invalid_request_error",
                code="model_not_found",
                param="model",
            )

        prompt_tokens = count_prompt_tokens(messages, tools)
        reply_fault: str | None = None
        window_entry: list[float] | None = None
        spec = self._next_scripted(model)
        if spec is not None:
            record.scripted, record.fault = True, spec.kind
            response = _scripted_response(spec, prompt_tokens)
            if response is not None:
                return response
            if spec.kind in ("hang", "latency"):
                seconds = spec.seconds
                record.delayed += self.config.hang_seconds if seconds is None else seconds
                await asyncio.sleep(self.config.hang_seconds if seconds is None else seconds)
            reply_fault = spec.kind if spec.kind in REPLY_FAULTS else None
        else:
            window_entry, rejection = self._admit(record.key_hash or "", prompt_tokens)
            if rejection is not None:
                record.fault = "quota"
                return rejection
        latency = self._latency()
        record.delayed += latency
        await asyncio.sleep(latency)
        if spec is None:
            fired, status = self._draw_faults()
            if "http_500" in fired:
                record.fault = "http_500"
                return _error(status, _SERVER_ERRORS[status], "server_error")
            if "hang" in fired:
                record.fault = "hang"
                record.delayed += self.config.hang_seconds
                await asyncio.sleep(self.config.hang_seconds)
                fired = []
        else:
            fired = []

        try:
            reply = policy(body)
        except Exception as error:
            log.exception("policy for %s failed", model)
            return _error(500, f"offline policy for {model} failed: {error!r}", "server_error")
        if reply_fault is not None:
            reply, applied = _apply_reply_fault(reply, reply_fault, tools)
            if not applied:
                record.fault = None  # scripted, but the reply had no tool call to damage
        else:
            for kind in fired:
                reply, applied = _apply_reply_fault(reply, kind, tools)
                if applied:
                    record.fault = kind
                    break

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
        reasoning = 0
        if deepseek_dialect and deepseek.thinking_enabled(body):
            message["reasoning_content"] = reasoning_text(reply)
            reasoning = count_text_tokens(message["reasoning_content"])
        completion_tokens = count_completion_tokens(content, tool_calls) + reasoning
        record.conversation, shared = self._prefix_cache(model, messages, tools)
        # OpenAI counts a cache hit in steps (1,024 tokens, then 128 more at a time); DeepSeek
        # hits whole prefix units, which are the messages here.
        cached_tokens = shared if deepseek_dialect else responses.openai_cached(shared)
        record.usage = Usage(prompt_tokens, completion_tokens, cached_tokens)
        if window_entry is not None:
            with self.lock:
                window_entry[1] += completion_tokens
        reply_body: dict[str, Any] = {
            "id": f"chatcmpl-offline-{next(self._completion_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        }
        if deepseek_dialect:
            reply_body["usage"] = deepseek.usage(
                prompt_tokens, completion_tokens, cached_tokens, reasoning
            )
        if spec is not None and spec.kind == "no_usage":
            del reply_body["usage"]
        return web.json_response(reply_body, dumps=lambda obj: orjson.dumps(obj).decode())

    async def messages(self, request: web.Request) -> web.Response:
        """Anthropic's Messages API (`offline/anthropic.py` holds its rules and shapes)."""
        return await self._recorded(self._messages, request)

    async def responses(self, request: web.Request) -> web.Response:
        """OpenAI's Responses API (`offline/responses.py` holds its rules and shapes)."""
        return await self._recorded(self._responses, request)

    async def _recorded(
        self,
        handle: Callable[[web.Request, RecordedRequest], Awaitable[web.Response]],
        request: web.Request,
    ) -> web.Response:
        """Handle a request of a native route, keeping its record in the request log."""
        record = RecordedRequest(seq=next(self._seq))
        try:
            response = await handle(request, record)
            record.status = response.status
            return response
        finally:
            with self.lock:
                self.records.append(record)

    async def _native_body(self, request: web.Request, record: RecordedRequest) -> dict[str, Any]:
        """A native route's JSON body (or `RequestError`), its model noted on the record."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as error:
            raise anthropic.RequestError(f"request body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise anthropic.RequestError("request body must be a JSON object")
        if body.get("stream"):
            raise anthropic.RequestError("stream: the offline provider answers stream: false")
        record.model = str(body.get("model"))
        return body

    async def _policy_reply(self, body: dict[str, Any], record: RecordedRequest) -> PolicyReply:
        """After the configured latency, the reply of the policy serving the record's model or
        its alias (checked with `_serves` first)."""
        latency = self._latency()
        record.delayed += latency
        await asyncio.sleep(latency)
        policy = self._policy(str(record.model))
        assert policy is not None
        return policy(body)

    def _policy(self, model: str) -> Policy | None:
        """The policy serving `model`, under its own name or an alias (`offline.model_aliases`)."""
        return self.policies.get(self.config.model_aliases.get(model, model))

    def _serves(self, model: str) -> bool:
        return self._policy(model) is not None

    async def _messages(self, request: web.Request, record: RecordedRequest) -> web.Response:
        def refuse(error: anthropic.RequestError) -> web.Response:
            return web.json_response(anthropic.error_body(error), status=error.status)

        key = request.headers.get("x-api-key")
        record.key_hash = key_hash(key) if key else None
        if self.config.require_key and not key:
            return refuse(
                anthropic.RequestError("x-api-key header is required", 401, "authentication_error")
            )
        if "anthropic-version" not in request.headers:
            return refuse(anthropic.RequestError("anthropic-version: header is required"))
        try:
            body = await self._native_body(request, record)
            record.messages = (
                body.get("messages") if isinstance(body.get("messages"), list) else None
            )
            thinking = anthropic.validate(body, self.signer)
        except anthropic.RequestError as error:
            return refuse(error)
        if not self._serves(record.model or ""):
            return refuse(anthropic.RequestError(f"model: {record.model}", 404, "not_found_error"))
        reply = await self._policy_reply(anthropic.policy_request(body), record)
        thought = reasoning_text(reply) if thinking else None
        content = anthropic.reply_content(reply, thought, self.signer)
        with self.lock:
            cache = self.prompt_caches.setdefault(
                f"{record.model}:{record.key_hash}", anthropic.PromptCache()
            )
            uncached, written, read = cache.usage(f"{record.model}", body)
        output = sum(
            count_text_tokens(
                orjson.dumps({k: v for k, v in b.items() if k != "signature"}).decode()
            )
            for b in content
        )
        record.usage = Usage(uncached + written + read, output, read, written)
        reply_body = {
            "id": f"msg_offline_{next(self._completion_ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": record.model,
            "content": content,
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": uncached,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
                "output_tokens": output,
            },
        }
        return web.json_response(reply_body, dumps=lambda obj: orjson.dumps(obj).decode())

    async def _responses(self, request: web.Request, record: RecordedRequest) -> web.Response:
        def refuse(error: anthropic.RequestError) -> web.Response:
            return web.json_response(responses.error_body(error), status=error.status)

        key = _bearer_key(request)
        record.key_hash = key_hash(key) if key else None
        if self.config.require_key and not key:
            return _missing_key()
        try:
            body = await self._native_body(request, record)
            record.messages = body.get("input") if isinstance(body.get("input"), list) else None
            responses.validate(body, self.signer)
        except anthropic.RequestError as error:
            return refuse(error)
        if not self._serves(record.model or ""):
            return _error(
                404,
                f"The model `{record.model}` does not exist",
                "invalid_request_error",
                code="model_not_found",
            )
        reply = await self._policy_reply(responses.policy_request(body), record)
        reasoning = reasoning_text(reply)
        output = responses.output_items(reply, reasoning, self.signer)
        with self.lock:
            cache = self.prefix_caches.setdefault(
                f"{record.model}:{record.key_hash}", responses.PrefixCache()
            )
            prompt, cached = cache.usage(str(record.model), body)
        thought = count_text_tokens(reasoning)
        completion = thought + count_completion_tokens(
            reply.content,
            [{"function": {"name": c.name, "arguments": c.arguments}} for c in reply.tool_calls],
        )
        record.usage = Usage(prompt, completion, cached)
        reply_body = {
            "id": f"resp_{next(self._completion_ids):06d}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": record.model,
            "output": output,
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": thought},
                "total_tokens": prompt + completion,
            },
        }
        return web.json_response(reply_body, dumps=lambda obj: orjson.dumps(obj).decode())

    def _next_scripted(self, model: str) -> Scripted | None:
        """Pop the first queued behaviour meant for this model (or for any model)."""
        with self.lock:
            for i, spec in enumerate(self.script):
                if spec.model is None or spec.model == model:
                    del self.script[i]
                    return spec
        return None

    def _admit(
        self, key: str, prompt_tokens: int
    ) -> tuple[list[float] | None, web.Response | None]:
        """Sliding-window quota check; an admitted request is entered in its key's window."""
        quotas = self.config.quotas
        if quotas.requests_per_minute is None and quotas.tokens_per_minute is None:
            return None, None
        now = time.monotonic()
        with self.lock:
            window = self.windows.setdefault(key, _Window())
            entries = window.entries
            while entries and entries[0][0] <= now - quotas.window_seconds:
                entries.popleft()
            rpm, tpm = quotas.requests_per_minute, quotas.tokens_per_minute
            if rpm is not None and len(entries) >= rpm:
                wait = entries[len(entries) - rpm][0] + quotas.window_seconds - now
                return None, _rate_limited(
                    wait, "requests", f"Limit {rpm}, Used {len(entries)}, Requested 1."
                )
            if tpm is not None:
                used = int(sum(entry[1] for entry in entries))
                if used + prompt_tokens > tpm:
                    if prompt_tokens > tpm:
                        wait = quotas.window_seconds  # never fits; say so, as OpenAI does
                        detail = f"Request too large: Limit {tpm}, Requested {prompt_tokens}."
                    else:
                        freed, wait = 0.0, quotas.window_seconds
                        for stamp, tokens in entries:
                            freed += tokens
                            if used - freed + prompt_tokens <= tpm:
                                wait = stamp + quotas.window_seconds - now
                                break
                        detail = f"Limit {tpm}, Used {used}, Requested {prompt_tokens}."
                    return None, _rate_limited(wait, "tokens", detail)
            entry = [now, float(prompt_tokens)]
            entries.append(entry)
            return entry, None

    def _latency(self) -> float:
        latency = self.config.latency
        if latency.kind == "none":
            return 0.0
        if latency.kind == "fixed":
            return latency.seconds
        with self.lock:
            mu = math.log(latency.seconds) - latency.sigma**2 / 2  # mean = latency.seconds
            delay = self.latency_rng.lognormvariate(mu, latency.sigma)
        return min(delay, latency.max_seconds) if latency.max_seconds is not None else delay

    def _draw_faults(self) -> tuple[list[str], int]:
        """Which random faults fire for this request, and the status a server error would use.

        Every admitted unscripted request draws the same number of values whatever fires, so a
        seed reproduces the same pattern over the same sequence of requests.
        """
        rates = self.config.faults
        with self.lock:
            draws = {kind: self.fault_rng.random() for kind in _FAULT_ORDER}
            status = self.fault_rng.choice(sorted(_SERVER_ERRORS))
        return [kind for kind in _FAULT_ORDER if draws[kind] < getattr(rates, kind)], status

    def _prefix_cache(
        self, model: str, messages: list[dict[str, Any]], tools: list[Any] | None
    ) -> tuple[str, int]:
        """(conversation id, cached tokens) for this request; remembers it for the next one."""
        conversation = hashlib.sha256(
            orjson.dumps([model, messages[:2]], option=orjson.OPT_SORT_KEYS)
        ).hexdigest()[:16]
        if not self.config.prefix_caching:
            return conversation, 0
        # Digests, not the messages: the cache holds thousands of long conversations.
        items = [
            hashlib.blake2b(orjson.dumps(x, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
            for x in [tools or [], *messages]
        ]
        head = hashlib.sha256(model.encode() + b"\0" + b"\0".join(items[:2])).hexdigest()
        with self.lock:
            previous = self.conversations.pop(conversation, [])
            self.conversations[conversation] = items
            while len(self.conversations) > MAX_CONVERSATIONS:
                self.conversations.popitem(last=False)
            head_seen = head in self.heads
            self.heads.add(head)
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


def _bearer_key(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def _missing_key() -> web.Response:
    return _error(
        401,
        "missing API key: send the header 'Authorization: Bearer KEY'",
        "authentication_error",
        code="invalid_api_key",
    )


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
    return None


def _rate_limited(wait: float, limit: str, detail: str) -> web.Response:
    retry_after = max(1, math.ceil(wait))
    return _error(
        429,
        f"Rate limit reached for {limit} per minute on the offline provider: {detail} "
        f"Please try again in {retry_after}s.",
        limit,
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after)},
    )


def _scripted_response(spec: Scripted, prompt_tokens: int) -> web.Response | None:
    """The response that replaces the reply for a scripted kind, or None to continue."""
    if spec.kind == "rate_limit":
        headers = None
        if spec.retry_after is not None and spec.retry_after_date:
            # An HTTP date has whole seconds: round up, so the client never waits too little.
            moment = math.ceil(time.time() + spec.retry_after)
            headers = {"Retry-After": email.utils.formatdate(moment, usegmt=True)}
        elif spec.retry_after is not None:
            headers = {"Retry-After": _format_seconds(spec.retry_after)}
        message = spec.message or "Rate limit reached for requests (scripted)."
        return _error(429, message, "requests", code="rate_limit_exceeded", headers=headers)
    if spec.kind == "insufficient_quota":
        return _error(
            429,
            spec.message
            or "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            code="insufficient_quota",
        )
    if spec.kind == "http_error":
        message = spec.message or _SERVER_ERRORS.get(spec.status, f"HTTP {spec.status} (scripted)")
        type_ = "server_error" if spec.status >= 500 else "invalid_request_error"
        return _error(spec.status, message, type_)
    if spec.kind == "error_body":
        error = {
            "message": spec.message or "The server had an error processing your request.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        return web.json_response({"error": error}, status=200)
    if spec.kind == "auth_error":
        return _error(
            401,
            spec.message or "Incorrect API key provided (scripted).",
            "authentication_error",
            code="invalid_api_key",
        )
    if spec.kind == "bad_request":
        return _error(400, spec.message or "Bad request (scripted).", "invalid_request_error")
    if spec.kind == "context_window":
        return _error(
            400,
            f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, your "
            f"messages resulted in {max(prompt_tokens, CONTEXT_WINDOW + 1)} tokens. "
            "Please reduce the length of the messages.",
            "invalid_request_error",
            code="context_length_exceeded",
            param="messages",
        )
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


def _apply_reply_fault(
    reply: PolicyReply, kind: str, tools: list[Any] | None
) -> tuple[PolicyReply, bool]:
    """Damage the reply as `kind` says; (reply, whether the fault applied)."""
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


class OfflineProvider:
    """The server in a background thread: `with OfflineProvider(config) as p: p.base_url`.

    `script()` queues one-shot behaviours, `requests` lists what the server saw, `reset()`
    clears the log, the script, the conversation caches, the quota windows and reseeds the RNGs.
    """

    def __init__(
        self,
        config: OfflineConfig | None = None,
        policies: dict[str, Policy] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self.config = config or OfflineConfig()
        self.host = host
        self._requested_port = self.config.port if port is None else port
        self._app = _App(self.config, default_policies() if policies is None else policies)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._port: int | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> OfflineProvider:
        """Start serving; returns once the socket accepts connections."""
        if self._thread is not None:
            raise RuntimeError("this OfflineProvider was already started")
        self._thread = threading.Thread(target=self._run, name="offline-provider", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            raise RuntimeError(
                f"offline provider could not listen on {self.host}:{self._requested_port}: "
                f"{self._startup_error}"
            ) from self._startup_error
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving; in-flight requests (hung ones included) are cancelled, not awaited."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None or loop is None or stop is None or not thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"offline provider did not stop within {timeout}s")

    def __enter__(self) -> OfflineProvider:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as error:
            if not self._ready.is_set():
                self._startup_error = error
            else:
                log.exception("offline provider crashed")
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024**2)  # long agent histories
        app.router.add_get("/v1/models", self._app.models)
        app.router.add_post("/v1/chat/completions", self._app.chat)
        app.router.add_post("/v1/messages", self._app.messages)  # Anthropic's native route
        app.router.add_post("/deepseek/chat/completions", self._app.deepseek_chat)
        app.router.add_post("/v1/responses", self._app.responses)  # OpenAI's Responses API
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,  # our own debug log never shows keys
            handler_cancellation=True,  # a client that gives up cancels its hung request
            shutdown_timeout=0.5,
        )
        await runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self._requested_port))
            site = web.SockSite(runner, sock)
            await site.start()
            self._port = sock.getsockname()[1]
            self._ready.set()
            await self._stop.wait()
        finally:
            for task in list(self._app.tasks):
                task.cancel()
            await runner.cleanup()
            sock.close()

    # -- what tests use -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the offline provider is not running")
        return self._port

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def models(self) -> list[str]:
        return list(self._app.policies)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the chat requests handled so far (the last `config.request_log`), in
        completion order."""
        with self._app.lock:
            return list(self._app.records)

    @property
    def in_flight(self) -> int:
        """Chat requests being handled right now (a hung request counts until cancelled)."""
        return len(self._app.tasks)

    def script(self, *specs: Scripted) -> None:
        """Queue one-shot behaviours, consumed in order by the next matching chat requests."""
        with self._app.lock:
            self._app.script.extend(specs)

    def reset(self) -> None:
        self._app.reset()


def serve(
    config: OfflineConfig | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    policies: dict[str, Policy] | None = None,
) -> None:
    """Serve until Ctrl-C or SIGTERM, printing the base URL (port: `config.port` unless given).

    The handlers are installed explicitly: a process started in the background inherits an
    ignored SIGINT, and Ctrl-C would then never arrive as KeyboardInterrupt.
    """
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with OfflineProvider(config, policies, host=host, port=port) as provider:
            print(f"offline provider listening on {provider.base_url}", flush=True)
            print(f"models: {', '.join(provider.models)}", flush=True)
            stop.wait()
            print("offline provider stopping", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
