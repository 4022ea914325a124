"""Providers' batch APIs through litellm, half the standard price, answers within 24 hours.
Callers speak Chat Completions both ways: each request is a chat body, each reply a chat
completion, whichever provider runs the batch.

- OpenAI's Batch API (`OpenAIBatches`): upload a JSONL file of requests, create a batch, poll
  it, download its output and error files. Each request line is `{"custom_id", "method": "POST",
  "url", "body"}`; each output line pairs its `custom_id` with `response.body` (a chat
  completion) or `error`.
- Anthropic's Message Batches (`AnthropicBatches`): each chat body is translated by litellm's
  Anthropic route into Messages `params` and the batch is created with `POST
  /v1/messages/batches` (litellm 1.106 polls and reads Anthropic batches but cannot create
  one); litellm polls it, and its results (`{custom_id, result: {type: succeeded, message} |
  errored | expired | canceled}`) are read back as chat completions by litellm's translation.

A request that errored or expired has no reply here: the caller sends it again in its next
batch. Batches are split at OpenAI's limits (50,000 requests, 200 MB), within Anthropic's.
"""

from __future__ import annotations

import abc
import asyncio
import io
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import litellm
import orjson
from pydantic import BaseModel

from piserini_ray.config import ModelConfig
from piserini_ray.llm.usage import usage_from
from piserini_ray.records import Usage

#: OpenAI's limits for one batch: requests, and bytes of its input file.
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024**2
ENDPOINT = "/v1/chat/completions"
#: litellm's flag for a poll that logs nothing (see `poll`).
QUIET_POLL = {"batch_ignore_default_logging": True}
#: A batch in one of these states changes no more.
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchRequest(BaseModel):
    custom_id: str
    body: dict[str, Any]


class BatchState(BaseModel):
    batch_id: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    #: Why the whole batch failed (its `errors`), when it did.
    errors: str | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


class BatchResult(BaseModel):
    """One request's outcome: its reply's text and usage, or why it has none."""

    custom_id: str
    content: str | None = None
    usage: Usage = Usage()
    error: str | None = None
    #: The whole reply (a chat completion), as a direct call would have returned it.
    reply: dict[str, Any] | None = None


def chat_body(model: ModelConfig, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A Chat Completions body for `model` (its name on the route, its reasoning effort,
    temperature and output cap), as a batch line carries it."""
    body: dict[str, Any] = {
        "model": model.resolved_litellm_model().split("/", 1)[-1],
        "messages": messages,
        **extra,
    }
    if model.reasoning_effort is not None:
        body["reasoning_effort"] = model.reasoning_effort
    if model.temperature is not None:
        body["temperature"] = model.temperature
    if model.max_output_tokens is not None:
        body["max_completion_tokens"] = model.max_output_tokens
    return body


def split(
    requests: list[BatchRequest], max_requests: int = MAX_REQUESTS, max_bytes: int = MAX_BYTES
) -> Iterator[list[BatchRequest]]:
    """The requests as batches within the provider's limits, in order."""
    chunk: list[BatchRequest] = []
    size = 0
    for request in requests:
        line = len(_line(request))
        if chunk and (len(chunk) >= max_requests or size + line > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(request)
        size += line
    if chunk:
        yield chunk


def _line(request: BatchRequest) -> bytes:
    return orjson.dumps(
        {"custom_id": request.custom_id, "method": "POST", "url": ENDPOINT, "body": request.body}
    )


class ProviderBatches(abc.ABC):
    """The batch API of one account (`api_base`, `api_key`) at one provider: `submit` is the
    provider's own; polling and reading the results go through litellm's batches and files
    calls."""

    #: litellm's name of the provider.
    provider = ""

    def __init__(self, api_base: str | None, api_key: str | None) -> None:
        self._auth: dict[str, Any] = {"custom_llm_provider": self.provider}
        if api_base:
            self._auth["api_base"] = api_base
        if api_key:
            self._auth["api_key"] = api_key

    @abc.abstractmethod
    async def submit(self, requests: list[BatchRequest], metadata: dict[str, str]) -> str:
        """Create a batch of the requests (chat bodies); its id."""

    async def close(self) -> None:
        """Close litellm's cached HTTP clients while their event loop still runs (litellm
        would close them later on a closed loop, with a traceback per client), and let the
        next loop make its own."""
        from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

        await close_litellm_async_clients()
        litellm.in_memory_llm_clients_cache.flush_cache()

    async def wait(
        self, batch_id: str, poll_seconds: float, on_status: Callable[[str], None]
    ) -> BatchState:
        """Poll the batch every `poll_seconds` until it ends; `on_status` hears each status
        it passes through (the last one included)."""
        state = await self.poll(batch_id)
        shown = None
        while True:
            if state.status != shown:
                on_status(state.status)
                shown = state.status
            if state.done:
                return state
            await asyncio.sleep(poll_seconds)
            state = await self.poll(batch_id)

    async def poll(self, batch_id: str) -> BatchState:
        # litellm would otherwise download a finished batch's results in the background on
        # every poll, to log its cost (we read them once, in `results`).
        batch = await litellm.aretrieve_batch(
            batch_id=batch_id, litellm_metadata=QUIET_POLL, **self._auth
        )
        errors = getattr(batch, "errors", None)
        return BatchState(
            batch_id=batch_id,
            status=str(batch.status),
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            errors=str(errors) if errors else None,
        )

    async def results(self, state: BatchState) -> list[BatchResult]:
        """Every request's outcome in a finished batch (output and error files)."""
        found: list[BatchResult] = []
        for file_id in (state.output_file_id, state.error_file_id):
            if not file_id:
                continue
            content = await litellm.afile_content(file_id=file_id, **self._auth)
            raw = content.content if hasattr(content, "content") else b""
            for line in self._as_chat(bytes(raw)).splitlines():
                if line.strip():
                    found.append(_result(orjson.loads(line)))
        return found

    def _as_chat(self, raw: bytes) -> bytes:
        """A results file as OpenAI batch output lines (chat completions)."""
        return raw


class OpenAIBatches(ProviderBatches):
    """OpenAI's Batch API: a JSONL file uploaded, then a batch over it."""

    provider = "openai"

    async def submit(self, requests: list[BatchRequest], metadata: dict[str, str]) -> str:
        """Upload the requests and create their batch; its id."""
        data = b"".join(_line(r) + b"\n" for r in requests)
        upload = await litellm.acreate_file(
            file=("requests.jsonl", io.BytesIO(data)), purpose="batch", **self._auth
        )
        batch = await litellm.acreate_batch(
            completion_window="24h",
            endpoint=ENDPOINT,
            input_file_id=upload.id,
            metadata=metadata,
            **self._auth,
        )
        return str(batch.id)


class AnthropicBatches(ProviderBatches):
    """Anthropic's Message Batches: the chat bodies as Messages params in one request.

    `api_base` is the host (litellm's Anthropic calls add `/v1/...` themselves). With `cache` (the
    model's `prompt_caching: auto`) each request marks its system prompt and its last message
    for the 1-hour cache: a batch can wait longer than the 5-minute cache lives, and the next
    turn of the query, in the next batch, reads the prefix its turn before wrote (1-hour writes
    cost twice the input price, reads a tenth).
    """

    provider = "anthropic"

    def __init__(self, api_base: str | None, api_key: str | None, cache: bool = False) -> None:
        super().__init__(api_base, api_key)
        self._cache = cache

    async def submit(self, requests: list[BatchRequest], metadata: dict[str, str]) -> str:
        """One `POST /v1/messages/batches` (metadata is not part of Anthropic's request), to
        the URL and with the headers litellm's own Anthropic batch calls use."""
        from litellm.llms.anthropic.batches.transformation import AnthropicBatchesConfig
        from litellm.llms.custom_httpx.http_handler import get_async_httpx_client
        from litellm.types.utils import LlmProviders

        body = {
            "requests": [
                {"custom_id": r.custom_id, "params": messages_params(r.body, self._cache)}
                for r in requests
            ]
        }
        config = AnthropicBatchesConfig()
        key, base = self._auth.get("api_key"), self._auth.get("api_base")
        headers = config.validate_environment({}, "", [], {}, {}, api_key=key, api_base=base)
        url = config.get_complete_batch_url(base, key, "", {}, {}, {})
        client = get_async_httpx_client(llm_provider=LlmProviders.ANTHROPIC)
        try:
            response = await client.post(url, headers=headers, data=orjson.dumps(body))
        except httpx.HTTPStatusError as error:  # litellm's handler raises on any non-2xx
            raise BatchRefused(
                f"Anthropic refused the Message Batch: HTTP {error.response.status_code} "
                f"{error.response.text[:500]}"
            ) from None
        return str(response.json()["id"])

    def _as_chat(self, raw: bytes) -> bytes:
        from litellm.llms.anthropic.files.handler import AnthropicFilesHandler

        return AnthropicFilesHandler()._transform_anthropic_batch_results_to_openai_format(raw)


class BatchRefused(Exception):
    """The provider refused to create a batch (its status and message)."""


def messages_params(body: dict[str, Any], cache: bool = False) -> dict[str, Any]:
    """A Chat Completions body as Anthropic Messages params, translated by litellm's Anthropic
    route as a direct call would be (tools, tool results, reasoning effort as thinking, output
    cap; parameters the route lacks, such as `seed`, dropped). A JSON `response_format` is
    dropped too: litellm would force a tool call whose reply it turns back into text only on a
    direct call; the judge's prompt asks for JSON itself. `cache`: the system prompt and the
    last message marked for the 1-hour cache (two of the four breakpoints Anthropic allows)."""
    from litellm.llms.anthropic.chat.transformation import AnthropicConfig

    body = dict(body)
    model, messages = body.pop("model"), body.pop("messages")
    body.pop("response_format", None)
    config = AnthropicConfig()
    optional = config.map_openai_params(
        non_default_params=body, optional_params={}, model=model, drop_params=True
    )
    params = config.transform_request(
        model=model, messages=messages, optional_params=optional, litellm_params={}, headers={}
    )
    if cache:
        for blocks in (params.get("system"), params["messages"][-1]["content"]):
            markable = [  # a thinking block cannot carry a mark
                b
                for b in blocks or []
                if isinstance(b, dict) and b.get("type") not in ("thinking", "redacted_thinking")
            ]
            if markable and isinstance(blocks, list):
                markable[-1]["cache_control"] = ONE_HOUR
    return {"model": model, **params}


#: Anthropic's 1-hour cache mark.
ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}


def batches_for(
    provider: str, api_base: str | None, api_key: str | None, cache: bool = False
) -> ProviderBatches:
    """The batch API of `provider` (litellm's name of a model's route); preflight has refused a
    `batch` tier on any other. `cache`: mark prompts for the provider's cache where it needs
    marks (Anthropic's; OpenAI caches by itself)."""
    if provider == "anthropic":
        return AnthropicBatches(api_base, api_key, cache)
    if provider == "openai":
        return OpenAIBatches(api_base, api_key)
    raise ValueError(f"no batch API for litellm provider {provider!r} (openai, anthropic)")


def _result(line: dict[str, Any]) -> BatchResult:
    """One line of an output or error file."""
    custom_id = str(line.get("custom_id"))
    response = line.get("response") or {}
    body = response.get("body") or {}
    error = line.get("error") or (body.get("error") if isinstance(body, dict) else None)
    status = response.get("status_code")
    if error or status not in (None, 200) or not body.get("choices"):
        reason = error.get("message") if isinstance(error, dict) else error
        return BatchResult(
            custom_id=custom_id,
            error=str(reason or f"HTTP {status} without a reply"),
        )
    message = body["choices"][0].get("message") or {}
    return BatchResult(
        custom_id=custom_id,
        reply=body,
        content=message.get("content"),
        usage=usage_from(body.get("usage") or {}),
    )
