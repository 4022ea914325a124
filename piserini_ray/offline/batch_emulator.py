"""What the offline provider's batch emulators share (one module per provider:
`openai_batches.py`, `anthropic_batches.py`): a batch's lines and their fates, the worker
that runs them through the provider's request pipeline, the ids' owners.

Every request of a batch runs through the provider's one request pipeline (`server.py`) with
the route's codec, exactly as a direct call would (auth with the creator's key, parse, quota
admission, latency, faults, policy, encode), so a batch's replies are the direct calls' replies;
it is recorded and billed at the `batch` tier (`RecordedRequest.service_tier`, `batch_id`).
A batch runs as an asyncio task on the server's loop: it never blocks the server and outlives
the request that created it, so a client that disconnects polls it later by id.

Life cycle: a batch waits `offline.batch.completion_seconds` in the queue, then runs its
requests one after the other in input order (so seeded faults and prompt caches see the same
sequence every time); a request refused by a quota window (429 with `retry-after`) waits and is
tried again, as a provider's batch queue throttles rather than fails. When the batch is created,
each request is given its fate (`FateDraw`): in the product every request runs; the test kit
draws some errored (a server error, not billed) or expired (never run, not billed). Results
come out in a seeded shuffled order, as both providers warn they may: pair them by
`custom_id`.

Errors are each provider's own shape (`openai_format.py`, `anthropic.py`); a batch or file of
another key is unknown (404), as another organisation's is.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import secrets
import string
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

import orjson
from aiohttp import web

from piserini_ray.config.offline import BatchConfig
from piserini_ray.offline.codec import Codec, Problem

#: The completion window both providers give a batch (expires_at).
WINDOW_SECONDS = 24 * 3600
#: Longest wait on a quota window's `retry-after` before a batch request is tried again.
MAX_QUOTA_WAIT = 60.0

#: Runs one request of a batch through the pipeline: (codec, the creator's headers, the body,
#: the batch id) -> the response a direct call would get.
LineRunner = Callable[[Codec, Mapping[str, str], bytes, str], Awaitable[web.Response]]
Fate = Literal["run", "errored", "expired"]
#: The fates of a new batch's n requests, in order (`hooks.Interceptor.batch_fates`).
FateDraw = Callable[[int], list[Fate]]
Outcome = Literal["succeeded", "errored", "expired", "canceled"]


def owner_of(headers: Mapping[str, str], codec: Codec) -> str:
    """Who a batch or file belongs to: a hash of the key it was created with."""
    return hashlib.sha256((codec.api_key(headers) or "").encode()).hexdigest()[:16]


def random_token(alphabet: str, n: int) -> str:
    """A random id of `n` characters of `alphabet`."""
    return "".join(secrets.choice(alphabet) for _ in range(n))


ALNUM = string.ascii_letters + string.digits


def rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def json_body(response: web.Response) -> dict[str, Any]:
    body = response.body
    return cast(dict[str, Any], orjson.loads(cast(bytes, body))) if body else {}


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


@dataclass
class Line:
    """One request of a batch and, once it ran, what came of it."""

    custom_id: str
    body: dict[str, Any]
    fate: Fate
    outcome: Outcome | None = None
    status: int | None = None
    response: dict[str, Any] | None = None
    request_id: str | None = None


@dataclass
class Batch:
    id: str
    owner: str
    codec: Codec
    headers: Mapping[str, str]
    lines: list[Line]
    created: float
    cancel_requested: bool = False
    ended: bool = False
    times: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # provider-specific fields


class BatchEmulator:
    """What both emulators share: fates, the worker, the tasks, the ids' owners."""

    def __init__(
        self, config: BatchConfig, seed: int, run_line: LineRunner, fates: FateDraw | None = None
    ) -> None:
        self.config = config
        self.seed = seed
        self.run_line = run_line
        self._fates = fates
        self.batches: dict[str, Batch] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def fates(self, n: int) -> list[Fate]:
        """Each request's fate, given in order when the batch is created."""
        return ["run"] * n if self._fates is None else self._fates(n)

    def start(self, batch: Batch) -> None:
        self.batches[batch.id] = batch
        task = asyncio.get_running_loop().create_task(self._work(batch), name=batch.id)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def find(self, request: web.Request, codec: Codec) -> Batch | None:
        batch = self.batches.get(request.match_info["batch_id"])
        return (
            batch if batch is not None and batch.owner == owner_of(request.headers, codec) else None
        )

    async def _work(self, batch: Batch) -> None:
        raise NotImplementedError

    async def run_lines(self, batch: Batch, on_line: Callable[[Line], None]) -> None:
        """Wait in the queue, then run each request (until a cancel), its outcome kept."""
        deadline = batch.created + self.config.completion_seconds
        while not batch.cancel_requested and time.time() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.time())))
        for line in batch.lines:
            if batch.cancel_requested:
                break
            if line.fate == "expired":
                line.outcome = "expired"
            elif line.fate == "errored":
                response = batch.codec.error(Problem("server_error"))
                line.outcome, line.status, line.response = "errored", 500, json_body(response)
                line.request_id = request_id_of(response)
            else:
                await self._run(batch, line)
            line.body = {}  # ran: a long rehearsal keeps only the replies of its batches
            on_line(line)
        for line in batch.lines:
            if line.outcome is None:
                line.outcome = "canceled"
                on_line(line)

    async def _run(self, batch: Batch, line: Line) -> None:
        raw = orjson.dumps(line.body)
        while True:
            response = await self.run_line(batch.codec, batch.headers, raw, batch.id)
            retry_after = response.headers.get("retry-after")
            if response.status == 429 and retry_after is not None:
                try:
                    wait = float(retry_after)
                except ValueError:
                    wait = 1.0
                await asyncio.sleep(min(max(wait, 0.01), MAX_QUOTA_WAIT))
                continue
            break
        line.status, line.response = response.status, json_body(response)
        line.request_id = request_id_of(response)
        line.outcome = "succeeded" if response.status == 200 else "errored"

    def shuffled(self, batch: Batch) -> list[Line]:
        """The lines in the seeded order their results come out in."""
        lines = list(batch.lines)
        random.Random(f"{self.seed}:order:{batch.id}").shuffle(lines)
        return lines


def request_id_of(response: web.Response) -> str:
    return (
        response.headers.get("request-id")
        or response.headers.get("x-request-id")
        or f"req_{secrets.token_hex(16)}"
    )
