"""The offline provider: a loopback server speaking each provider's wire format (OpenAI's Chat
Completions and Responses, Anthropic's Messages, DeepSeek's chat), whose models are policies.

The framework reaches it through litellm exactly as it reaches a real provider, so test suites and
rehearsal runs exercise the real client path (HTTP, retries, timeouts, usage accounting) at zero
cost. Every route runs one request pipeline; what differs between routes is a small codec
(`codec.Codec`: `chat.py`, `deepseek.py`, `anthropic.py`, `responses.py`) that reads the route's
key header and body and writes its replies and errors. The stages, in order:

1. **auth**: the route's key header (401 in the route's format when a key is required and none
   came; Anthropic's route also requires `anthropic-version`);
2. **parse**: the body decoded and validated as the real API validates it (400), the model
   looked up among the policies and their aliases (404);
3. **quota admission**: the key's sliding windows admit the request or refuse it with a 429
   that names the full window (`quota.py`), in the route's format with its rate-limit headers;
4. **latency**: the configured latency (`asyncio.sleep`, so concurrent requests overlap);
5. **policy**: the policy of the model answers the request, shown to it in the chat-completions
   shape;
6. **encode**: the reply in the route's format with the usage it bills (prefix caching shaped
   as each provider's, see the codecs); its completion tokens join the quota window.

Every failure is a `codec.Problem`, rendered by the route's codec as its provider renders it.
An `Interceptor` (`hooks.py`) may add to the stages: the product's adds nothing; the test kit's
(`piserini_ray_testkit`) injects faults, scripted failures and held requests there.

The batch emulators (`openai_batches.py`: OpenAI's `/v1/files` + `/v1/batches`;
`anthropic_batches.py`: Anthropic's `/v1/messages/batches`; shared: `batch_emulator.py`) run
each request of a batch through this same pipeline, recorded with `service_tier="batch"` and
its `batch_id`; `OfflineProvider.bill` sums every billed request's
usage by (tier, model), whatever the request log kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import random
import signal
import socket
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Self

import orjson
from aiohttp import web

from piserini_ray.config.offline import OfflineConfig
from piserini_ray.offline import anthropic
from piserini_ray.offline.anthropic import MessagesCodec
from piserini_ray.offline.anthropic_batches import ANTHROPIC_MAX_BYTES, AnthropicBatchEmulator
from piserini_ray.offline.bill import Bill, BillLine, RecordedRequest, key_hash
from piserini_ray.offline.chat import ChatCodec, ConversationCache
from piserini_ray.offline.codec import Codec, Parsed, Problem, Usage
from piserini_ray.offline.deepseek import DeepSeekCodec
from piserini_ray.offline.hooks import Interceptor, Ticket
from piserini_ray.offline.openai_batches import OpenAIBatchEmulator
from piserini_ray.offline.openai_format import bearer_key, missing_bearer_key, openai_error
from piserini_ray.offline.policy import Policy, PolicyReply
from piserini_ray.offline.quota import Quotas
from piserini_ray.offline.responses import ResponsesCodec

log = logging.getLogger(__name__)

__all__ = [
    "Bill",
    "BillLine",
    "OfflineProvider",
    "RecordedRequest",
    "Usage",
    "default_policies",
    "key_hash",
    "serve",
]


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


class _App:
    """The request pipeline, shared state and RNGs; runs on the server thread's event loop."""

    def __init__(
        self, config: OfflineConfig, policies: dict[str, Policy], interceptor: Interceptor
    ) -> None:
        self.config = config
        self.policies = dict(policies)
        self.interceptor = interceptor
        self.lock = threading.Lock()  # guards the log, the bill and the RNG
        # The most recent requests only: each holds its whole conversation, so keeping all of a
        # long rehearsal's (21,000 requests of 40-call conversations) would take gigabytes.
        self.records: deque[RecordedRequest] = deque(maxlen=config.request_log)
        self.bill = Bill()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._seq = itertools.count(1)
        self.quotas = Quotas(config.quotas)
        signer = anthropic.Signer(os.urandom(32))
        conversations = ConversationCache(config.prefix_caching)  # both chat routes'
        self.chat_codec = ChatCodec(conversations)
        self.deepseek_codec = DeepSeekCodec(conversations)
        self.messages_codec = MessagesCodec(signer)
        self.responses_codec = ResponsesCodec(signer)
        self.codecs: tuple[Codec, ...] = (
            self.chat_codec,
            self.deepseek_codec,
            self.messages_codec,
            self.responses_codec,
        )
        self.openai_batches = OpenAIBatchEmulator(
            config.batch,
            config.seed,
            self.batch_request,
            {"/v1/chat/completions": self.chat_codec, "/v1/responses": self.responses_codec},
            config.require_key,
            interceptor.batch_fates,
        )
        self.anthropic_batches = AnthropicBatchEmulator(
            config.batch,
            config.seed,
            self.batch_request,
            self.messages_codec,
            config.require_key,
            interceptor.batch_fates,
        )
        self.reset()

    def reset(self) -> None:
        """Clear the log, the bill, the conversation caches and the quota windows, reseed the
        latency, and reset the interceptor."""
        with self.lock:
            self.records.clear()
            self.bill = Bill()
            # A stream of its own, so an interceptor's draws never shift the latencies.
            self.latency_rng = random.Random(f"{self.config.seed}:latency")
        self.quotas.reset()
        self.interceptor.reset()
        for codec in self.codecs:
            codec.reset()

    # -- aiohttp handlers ---------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        if self.config.require_key and bearer_key(request.headers) is None:
            return openai_error(missing_bearer_key())
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "piserini-ray-offline"}
            for name in self.policies
        ]
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.Response:
        """OpenAI's Chat Completions (`chat.py`)."""
        return await self.handle(self.chat_codec, request)

    async def deepseek_chat(self, request: web.Request) -> web.Response:
        """DeepSeek's chat API: the OpenAI shape with its thinking-mode rules, usage fields and
        errors (`deepseek.py`)."""
        return await self.handle(self.deepseek_codec, request)

    async def messages(self, request: web.Request) -> web.Response:
        """Anthropic's Messages API (`anthropic.py`)."""
        return await self.handle(self.messages_codec, request)

    async def responses(self, request: web.Request) -> web.Response:
        """OpenAI's Responses API (`responses.py`)."""
        return await self.handle(self.responses_codec, request)

    async def handle(self, codec: Codec, request: web.Request) -> web.Response:
        """One HTTP request of any route, through the pipeline, kept in the request log."""
        task = asyncio.current_task()
        assert task is not None
        record = RecordedRequest(seq=next(self._seq), route=codec.name)
        self.tasks.add(task)
        record.concurrent = len(self.tasks)
        try:
            return await self.execute(codec, request.headers, request.read, record)
        finally:
            self.tasks.discard(task)

    async def execute(
        self,
        codec: Codec,
        headers: Mapping[str, str],
        read: Callable[[], Awaitable[bytes]],
        record: RecordedRequest,
    ) -> web.Response:
        """One request through the pipeline (an HTTP request, or a request of a batch), its
        response, the record kept in the request log and its usage on the bill."""
        try:
            await self.interceptor.gate()
            try:
                response = await self._pipeline(codec, headers, read, record)
            except Problem as problem:
                response = codec.error(problem)
            record.status = response.status
            return response
        finally:
            with self.lock:
                self.records.append(record)
                if record.usage is not None:
                    self.bill.add(record)
            log.debug(
                "%s model=%s status=%s fault=%s key=%s tier=%s",
                codec.name,
                record.model,
                record.status,
                record.fault,
                record.key_hash,
                record.service_tier,
            )

    async def batch_request(
        self, codec: Codec, headers: Mapping[str, str], body: bytes, batch_id: str
    ) -> web.Response:
        """One request of a batch: the same pipeline as a direct call, billed at the batch
        tier (`batch_emulator.py`)."""
        record = RecordedRequest(
            seq=next(self._seq), route=codec.name, service_tier="batch", batch_id=batch_id
        )

        async def read() -> bytes:
            return body

        return await self.execute(codec, headers, read, record)

    # -- the pipeline -------------------------------------------------------------------------

    async def _pipeline(
        self,
        codec: Codec,
        headers: Mapping[str, str],
        read: Callable[[], Awaitable[bytes]],
        record: RecordedRequest,
    ) -> web.Response:
        """The stages of the module docstring; a failure at any of them raises `Problem`."""
        parsed, policy = await self._parse(codec, headers, read, record)  # 1. auth, 2. parse
        ticket, entry = self._admit(parsed, record)  # 3. quota admission
        try:
            await ticket.delay(record)  # 4. latency
            latency = self._latency()
            record.delayed += latency
            await asyncio.sleep(latency)
            await ticket.fault(record)
        except asyncio.CancelledError:
            # Admitted, then cut (the client's time budget, or the server stopping): the
            # prompt was received and is billed, which is what the client estimates for it.
            record.cut = True
            record.usage = Usage(parsed.prompt_tokens, 0, 0)
            raise
        shown = codec.policy_request(parsed)  # 5. policy
        reply = ticket.damage(self._reply(policy, shown, parsed.model), shown, record)
        encoded = codec.encode(parsed, reply, record.key_hash)  # 6. encode
        record.usage, record.conversation = encoded.usage, encoded.conversation
        self.quotas.add(entry, encoded.usage.completion_tokens)
        ticket.encoded(codec, encoded.body)
        return web.json_response(encoded.body, dumps=lambda obj: orjson.dumps(obj).decode())

    async def _parse(
        self,
        codec: Codec,
        headers: Mapping[str, str],
        read: Callable[[], Awaitable[bytes]],
        record: RecordedRequest,
    ) -> tuple[Parsed, Policy]:
        """Auth and parse: the request as the route's codec accepts it, and its policy."""
        key = codec.api_key(headers)
        record.key_hash = key_hash(key) if key is not None else None
        if self.config.require_key and key is None:
            raise codec.missing_key()
        codec.check_headers(headers)
        body = codec.decode(await read())
        record.model, record.messages, record.tools = codec.describe(body)
        if record.service_tier != "batch" and codec.name in ("chat", "responses"):
            # OpenAI's `service_tier` request parameter: flex and priority are billed apart.
            tier = body.get("service_tier")
            record.service_tier = tier if tier in ("flex", "priority") else "standard"
        parsed = codec.validate(body)
        policy = self._policy(parsed.model)
        if policy is None:
            raise codec.unknown_model(parsed.model, sorted(self.policies))
        return parsed, policy

    def _admit(self, parsed: Parsed, record: RecordedRequest) -> tuple[Ticket, list[float] | None]:
        """The interceptor's ticket for the request (it may fail it here, or take it past the
        quota windows), and the quota windows' entry of the admitted request (None without
        quotas, or past them)."""
        ticket = self.interceptor.ticket(parsed, record)
        if ticket.bypasses_quota:
            return ticket, None
        try:
            return ticket, self.quotas.admit(record.key_hash or "", lambda: parsed.prompt_tokens)
        except Problem:
            record.fault = "quota"
            raise

    def _reply(self, policy: Policy, shown: dict[str, Any], model: str) -> PolicyReply:
        try:
            return policy(shown)
        except Exception as error:
            log.exception("policy for %s failed", model)
            raise Problem(
                "server_error", f"offline policy for {model} failed: {error!r}", status=500
            ) from None

    def _policy(self, model: str) -> Policy | None:
        """The policy serving `model`, under its own name or an alias (`offline.model_aliases`)."""
        return self.policies.get(self.config.model_aliases.get(model, model))

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


class OfflineProvider:
    """The server in a background thread: `with OfflineProvider(config) as p: p.base_url`.

    `requests` lists what the server saw, `bill` what it billed. `interceptor`: what to add to
    the pipeline (`hooks.py`; the test kit's `EmulatedProvider` passes its own).
    """

    def __init__(
        self,
        config: OfflineConfig | None = None,
        policies: dict[str, Policy] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        interceptor: Interceptor | None = None,
    ) -> None:
        self.config = config or OfflineConfig()
        self.host = host
        self._requested_port = self.config.port if port is None else port
        self._app = _App(
            self.config,
            default_policies() if policies is None else policies,
            Interceptor() if interceptor is None else interceptor,
        )
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._port: int | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
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

    def __enter__(self) -> Self:
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
        # Long agent histories, and a Message Batch of up to 256 MB (refused in Anthropic's
        # shape above that, and by aiohttp beyond this margin).
        app = web.Application(client_max_size=ANTHROPIC_MAX_BYTES + 16 * 1024**2)
        app.router.add_get("/v1/models", self._app.models)
        app.router.add_post("/v1/chat/completions", self._app.chat)
        app.router.add_post("/v1/messages", self._app.messages)  # Anthropic's native route
        app.router.add_post("/deepseek/chat/completions", self._app.deepseek_chat)
        app.router.add_post("/v1/responses", self._app.responses)  # OpenAI's Responses API
        openai_batches, anthropic_batches = self._app.openai_batches, self._app.anthropic_batches
        app.router.add_post("/v1/files", openai_batches.upload_file)  # OpenAI's Batch API
        app.router.add_get("/v1/files/{file_id}", openai_batches.get_file)
        app.router.add_delete("/v1/files/{file_id}", openai_batches.delete_file)
        app.router.add_get("/v1/files/{file_id}/content", openai_batches.file_content)
        app.router.add_post("/v1/batches", openai_batches.create)
        app.router.add_get("/v1/batches", openai_batches.list)
        app.router.add_get("/v1/batches/{batch_id}", openai_batches.retrieve)
        app.router.add_post("/v1/batches/{batch_id}/cancel", openai_batches.cancel)
        app.router.add_post("/v1/messages/batches", anthropic_batches.create)  # Anthropic's
        app.router.add_get("/v1/messages/batches", anthropic_batches.list)
        app.router.add_get("/v1/messages/batches/{batch_id}", anthropic_batches.retrieve)
        app.router.add_post("/v1/messages/batches/{batch_id}/cancel", anthropic_batches.cancel)
        app.router.add_get("/v1/messages/batches/{batch_id}/results", anthropic_batches.results)
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
            await self._app.openai_batches.stop()
            await self._app.anthropic_batches.stop()
            await runner.cleanup()
            sock.close()

    # -- what it saw ---------------------------------------------------------------------------

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
        """A snapshot of the requests handled so far on every route (the last
        `config.request_log`), in completion order."""
        with self._app.lock:
            return list(self._app.records)

    @property
    def in_flight(self) -> int:
        """Requests being handled right now (a hung request counts until cancelled)."""
        return len(self._app.tasks)

    @property
    def bill(self) -> dict[tuple[str, str], BillLine]:
        """The emulator's bill so far: usage of every billed request by (service tier, model),
        e.g. `bill[("batch", "gpt-5.4-mini")].prompt_tokens`."""
        with self._app.lock:
            return {key: replace(line) for key, line in self._app.bill.lines.items()}


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
