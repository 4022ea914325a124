"""Batched agent turns (`model.service_tier: batch`): the next model call of every active query
gathered into one provider batch (OpenAI's Batch API or Anthropic's Message Batches,
`llm/batches.py`), half the price.

The agent loop is unchanged: its client hands each call's request body to the batcher and
awaits the reply. The batcher waits `gather_seconds` after the first request of a round (the
other queries' turns arrive meanwhile), sends them as one batch, polls it, and hands each
request its reply. A request that errored or expired goes into the next round.

Each request is named by the SHA-256 of its body. The ledger (`store.TurnLedger`, a JSONL
file in the run directory) holds every batch when it is created and every reply when it is
read: a driver killed while a batch is in flight resumes by polling that batch, and a query run
again after the kill finds each turn it finished before in the ledger (the agent is
deterministic given its replies, so it sends the same bodies) instead of paying for it twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from piserini_ray.llm.batches import BatchRequest, ProviderBatches, split
from piserini_ray.llm.failures import Failure, FailureKind, RetryError
from piserini_ray.llm.scrubber import scrub

Log = Callable[[str], None]


def request_id(body: dict[str, Any]) -> str:
    """A request's name in every batch and in the ledger: the hash of its body."""
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:40]


class Ledger(Protocol):
    """Where a batcher keeps its batches and replies across a driver's restarts (the store's
    `TurnLedger`: a crash-safe JSONL file in the run directory)."""

    #: Replies read so far, by request name.
    replies: dict[str, dict[str, Any]]
    #: Batches created and not closed: batch id -> its request names.
    open: dict[str, list[str]]

    def created(self, batch_id: str, ids: list[str]) -> None: ...

    def replied(self, rid: str, reply: dict[str, Any]) -> None: ...

    def closed(self, batch_id: str) -> None: ...


class TurnBatcher:
    """One model's batcher: `await complete(body)` is the chat completion the batch returned."""

    def __init__(
        self,
        api: ProviderBatches,
        ledger: Ledger,
        gather_seconds: float,
        poll_seconds: float,
        max_rounds: int,
        log: Log = lambda _m: None,
    ) -> None:
        self.api, self.ledger, self.log = api, ledger, log
        self.gather_seconds, self.poll_seconds, self.max_rounds = (
            gather_seconds,
            poll_seconds,
            max_rounds,
        )
        self._queued: dict[str, dict[str, Any]] = {}  # request name -> body, for the next round
        self._bodies: dict[str, dict[str, Any]] = {}  # every request waited for, by name
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._rounds: dict[str, int] = {}
        self._round: asyncio.Task[None] | None = None
        self._polls: dict[str, asyncio.Task[None]] = {}
        self.batches_sent = 0

    async def close(self) -> None:
        """Stop polling (a batch still in flight stays in the ledger: the next run polls it)
        and close the HTTP clients of this event loop."""
        for task in [self._round, *self._polls.values()]:
            if task is not None:
                task.cancel()
        await self.api.close()

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        rid = request_id(body)
        if rid in self.ledger.replies:  # finished before the driver was stopped
            return self.ledger.replies[rid]
        future = self._waiting.get(rid)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._waiting[rid] = future
            self._bodies[rid] = body
            in_flight = [b for b, ids in self.ledger.open.items() if rid in ids]
            if in_flight:  # sent before the driver was stopped: poll it, never send again
                self._poll(in_flight[0])
            else:
                self._queue(rid, body)
        return await asyncio.shield(future)

    def _queue(self, rid: str, body: dict[str, Any]) -> None:
        self._queued[rid] = body
        if self._round is None or self._round.done():
            self._round = asyncio.ensure_future(self._send_round())

    async def _send_round(self) -> None:
        await asyncio.sleep(self.gather_seconds)  # let the other queries' turns arrive
        queued, self._queued = self._queued, {}
        requests = [BatchRequest(custom_id=rid, body=body) for rid, body in queued.items()]
        for chunk in split(requests):
            try:
                batch_id = await self.api.submit(chunk, {"purpose": "agent turns"})
            except Exception as error:  # every waiter of the chunk hears why
                for request in chunk:
                    self._fail(request.custom_id, f"the batch could not be created: {error}")
                continue
            self.batches_sent += 1
            self.ledger.created(batch_id, [r.custom_id for r in chunk])
            self.log(f"batch {batch_id}: {len(chunk)} model turns sent")
            self._poll(batch_id)
        if self._queued:  # arrived while this round was being sent
            self._round = asyncio.ensure_future(self._send_round())

    def _poll(self, batch_id: str) -> None:
        # A poll that ended without reading the batch (`_collect`'s failure) leaves it open:
        # a turn retried with the same body polls it again, or it would wait forever.
        task = self._polls.get(batch_id)
        if task is None or task.done():
            self._polls[batch_id] = asyncio.ensure_future(self._collect(batch_id))

    async def _collect(self, batch_id: str) -> None:
        try:
            state = await self.api.wait(batch_id, self.poll_seconds, lambda _status: None)
            results = {r.custom_id: r for r in await self.api.results(state)}
        except Exception as error:  # every waiter of the batch hears why
            for rid in self.ledger.open.get(batch_id, []):
                self._fail(rid, f"batch {batch_id} could not be read: {error}")
            return
        for rid in self.ledger.open.get(batch_id, []):
            result = results.get(rid)
            if result is not None and result.error is None and result.reply is not None:
                self.ledger.replied(rid, result.reply)
                self._resolve(rid, result.reply)
            else:
                why = result.error if result is not None else f"batch {batch_id} {state.status}"
                self._retry(rid, str(why))
        self.ledger.closed(batch_id)
        self.log(f"batch {batch_id}: {state.status}")

    def _retry(self, rid: str, why: str) -> None:
        """An errored or expired request: into the next round, up to `max_rounds` (one no
        query waits for any more is left alone)."""
        if rid not in self._waiting:
            return
        self._rounds[rid] = self._rounds.get(rid, 1) + 1
        if self._rounds[rid] > self.max_rounds:
            self._fail(rid, f"no reply after {self._rounds[rid] - 1} batch(es): {why}")
        else:
            self._queue(rid, self._bodies[rid])

    def _resolve(self, rid: str, reply: dict[str, Any]) -> None:
        self._bodies.pop(rid, None)
        future = self._waiting.pop(rid, None)
        if future is not None and not future.done():
            future.set_result(reply)

    def _fail(self, rid: str, why: str) -> None:
        self._bodies.pop(rid, None)
        future = self._waiting.pop(rid, None)
        if future is not None and not future.done():
            # `why` is the provider's own text, which may quote the key it was sent.
            failure = Failure(FailureKind.TRANSIENT, scrub(why))
            future.set_exception(RetryError(failure, attempts=1))
