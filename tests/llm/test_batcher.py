"""The agent's turn batcher (`llm/batcher.py`) around a batch API whose first read of a batch
fails: the turn hears why, and the same turn asked again (the client's retry: the same body,
so the same request name, still in the open batch) polls that batch again and gets its reply,
instead of waiting forever on a poll that had already ended."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from piserini_ray.llm.batcher import TurnBatcher, request_id
from piserini_ray.llm.batches import BatchRequest, BatchResult, BatchState
from piserini_ray.llm.failures import RetryError

REPLY = {"choices": [{"message": {"role": "assistant", "content": "Paris"}}]}


class _Ledger:
    def __init__(self) -> None:
        self.replies: dict[str, dict[str, Any]] = {}
        self.open: dict[str, list[str]] = {}

    def created(self, batch_id: str, ids: list[str]) -> None:
        self.open[batch_id] = list(ids)

    def replied(self, rid: str, reply: dict[str, Any]) -> None:
        self.replies[rid] = reply

    def closed(self, batch_id: str) -> None:
        self.open.pop(batch_id, None)


class _FlakyReads:
    """A batch API whose first read of a batch fails (a transient error under load)."""

    def __init__(self) -> None:
        self.submitted: list[list[str]] = []
        self.reads = 0

    async def submit(self, requests: list[BatchRequest], metadata: dict[str, str]) -> str:
        self.submitted.append([r.custom_id for r in requests])
        return f"batch-{len(self.submitted)}"

    async def wait(self, batch_id: str, poll_seconds: float, seen: Any) -> BatchState:
        self.reads += 1
        if self.reads == 1:
            raise ConnectionError("the batch API did not answer")
        return BatchState(batch_id=batch_id, status="completed")

    async def results(self, state: BatchState) -> list[BatchResult]:
        return [BatchResult(custom_id=rid, reply=REPLY) for rid in self.submitted[-1]]

    async def close(self) -> None:
        pass


def test_a_turn_asked_again_after_a_failed_read_polls_its_batch_again() -> None:
    api, ledger = _FlakyReads(), _Ledger()
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": "capital of France?"}]}

    async def scenario() -> dict[str, Any]:
        batcher = TurnBatcher(api, ledger, gather_seconds=0, poll_seconds=0, max_rounds=3)  # type: ignore[arg-type]
        with pytest.raises(RetryError, match="could not be read"):
            await batcher.complete(body)
        assert ledger.open == {"batch-1": [request_id(body)]}  # still open: never paid twice
        reply = await asyncio.wait_for(batcher.complete(body), 60)  # liveness only
        await batcher.close()
        return reply

    assert asyncio.run(scenario()) == REPLY
    assert api.submitted == [[request_id(body)]]  # one batch: the retry polled it again
    assert ledger.open == {} and ledger.replies == {request_id(body): REPLY}
