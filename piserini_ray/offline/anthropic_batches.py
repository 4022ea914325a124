"""The offline provider's emulator of Anthropic's Message Batches (`/v1/messages/batches`), as
strict as the published API; what both batch emulators share is `batch_emulator.py`.

Anthropic (https://docs.anthropic.com/en/api/creating-message-batches,
https://docs.anthropic.com/en/docs/build-with-claude/batch-processing):
- `POST /v1/messages/batches` with `requests: [{custom_id, params}]`: 1 to 100,000 requests
  and at most 256 MB (413 `request_too_large`), each `custom_id` unique and matching
  `^[a-zA-Z0-9_-]{1,64}$`; `params` are checked when the request runs (an invalid one ends
  `errored`), as the API does. `anthropic-version` is required on every call.
- `processing_status` `in_progress` -> `ended` (`canceling` after `.../cancel`), `request_counts
  {processing, succeeded, errored, canceled, expired}`, `results_url` once ended; the results
  are a JSONL stream of `{custom_id, result: {type: succeeded, message} | {type: errored,
  error: <error response>} | {type: canceled} | {type: expired}}`.
Errors are the Messages codec's (`anthropic.py`); a batch of another key is unknown (404), as
another organisation's is.
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from piserini_ray.config.offline import BatchConfig
from piserini_ray.offline.batch_emulator import (
    ALNUM,
    WINDOW_SECONDS,
    Batch,
    BatchEmulator,
    FateDraw,
    Line,
    LineRunner,
    dumps,
    owner_of,
    random_token,
    rfc3339,
)
from piserini_ray.offline.codec import Codec, Problem, decode_json_object, refused

#: Published limits (see the module docstring).
ANTHROPIC_MAX_REQUESTS = 100_000
ANTHROPIC_MAX_BYTES = 256 * 1024**2
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class AnthropicBatchEmulator(BatchEmulator):
    """Anthropic's Message Batches (errors rendered by the Messages codec)."""

    def __init__(
        self,
        config: BatchConfig,
        seed: int,
        run_line: LineRunner,
        codec: Codec,
        require_key: bool,
        fates: FateDraw | None = None,
    ) -> None:
        super().__init__(config, seed, run_line, fates)
        self.codec = codec
        self.require_key = require_key
        self.max_requests = min(
            ANTHROPIC_MAX_REQUESTS, config.max_requests or ANTHROPIC_MAX_REQUESTS
        )
        self.max_bytes = min(ANTHROPIC_MAX_BYTES, config.max_bytes or ANTHROPIC_MAX_BYTES)

    def _refused(self, request: web.Request) -> web.Response | None:
        """Auth and the required `anthropic-version` header, as on every Anthropic route."""
        try:
            if self.require_key and self.codec.api_key(request.headers) is None:
                raise self.codec.missing_key()
            self.codec.check_headers(request.headers)
        except Problem as problem:
            return self.codec.error(problem)
        return None

    async def create(self, request: web.Request) -> web.Response:
        if (denied := self._refused(request)) is not None:
            return denied
        raw = await request.read()
        try:
            if len(raw) > self.max_bytes:
                raise Problem(
                    "invalid_request",
                    f"Request exceeds the maximum allowed number of bytes: a Message Batch can "
                    f"be up to {self.max_bytes:,} bytes.",
                    status=413,
                )
            requests = self._validate(raw)
        except Problem as problem:
            return self.codec.error(problem)
        fates = self.fates(len(requests))
        batch = Batch(
            f"msgbatch_{random_token(ALNUM, 24)}",
            owner_of(request.headers, self.codec),
            self.codec,
            CIMultiDict(request.headers),
            [Line(c, p, f) for (c, p), f in zip(requests, fates, strict=True)],
            time.time(),
            data={"results_url": None, "base": f"{request.scheme}://{request.host}"},
        )
        self.start(batch)
        return web.json_response(self.object(batch), dumps=dumps)

    def _validate(self, raw: bytes) -> list[tuple[str, dict[str, Any]]]:
        body = decode_json_object(raw)
        for name in body:
            if name != "requests":
                raise refused(f"{name}: Extra inputs are not permitted")
        if "requests" not in body:
            raise refused("requests: Field required")
        requests = body["requests"]
        if not isinstance(requests, list):
            raise refused("requests: Input should be a valid list")
        if not requests:
            raise refused("requests: List should have at least 1 item after validation, not 0")
        if len(requests) > self.max_requests:
            raise refused(
                f"requests: List should have at most {self.max_requests} items after "
                f"validation, not {len(requests)}"
            )
        seen: set[str] = set()
        out: list[tuple[str, dict[str, Any]]] = []
        for i, item in enumerate(requests):
            if not isinstance(item, dict):
                raise refused(f"requests.{i}: Input should be a valid dictionary")
            for name in ("custom_id", "params"):
                if name not in item:
                    raise refused(f"requests.{i}.{name}: Field required")
            for name in item:
                if name not in ("custom_id", "params"):
                    raise refused(f"requests.{i}.{name}: Extra inputs are not permitted")
            custom_id, params = item["custom_id"], item["params"]
            if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
                raise refused(
                    f"requests.{i}.custom_id: String should match pattern '{CUSTOM_ID.pattern}'"
                )
            if custom_id in seen:
                raise refused(
                    f"requests.{i}.custom_id: Duplicate custom_id '{custom_id}': each request "
                    "in a Message Batch must have a unique custom_id"
                )
            if not isinstance(params, dict):
                raise refused(f"requests.{i}.params: Input should be a valid dictionary")
            seen.add(custom_id)
            out.append((custom_id, params))
        return out

    async def _work(self, batch: Batch) -> None:
        await self.run_lines(batch, lambda line: None)
        batch.times["ended_at"] = time.time()
        batch.data["results_url"] = f"{batch.data['base']}/v1/messages/batches/{batch.id}/results"
        batch.ended = True

    def object(self, batch: Batch) -> dict[str, Any]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        for line in batch.lines:
            counts[line.outcome if line.outcome is not None else "processing"] += 1

        def at(name: str) -> str | None:
            moment = batch.times.get(name)
            return rfc3339(moment) if moment is not None else None

        status = (
            "ended" if batch.ended else "canceling" if batch.cancel_requested else ("in_progress")
        )
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "ended_at": at("ended_at"),
            "created_at": rfc3339(batch.created),
            "expires_at": rfc3339(batch.created + WINDOW_SECONDS),
            "archived_at": None,
            "cancel_initiated_at": at("cancel_initiated_at"),
            "results_url": batch.data["results_url"],
        }

    def _batch(self, request: web.Request) -> Batch | web.Response:
        if (denied := self._refused(request)) is not None:
            return denied
        batch = self.find(request, self.codec)
        if batch is None:
            problem = Problem(
                "not_found", f"message_batch_id: {request.match_info['batch_id']} not found"
            )
            return self.codec.error(problem)
        return batch

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        return web.json_response(self.object(batch), dumps=dumps)

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.ended:
            return self.codec.error(
                refused(f"Message Batch {batch.id} has ended processing and cannot be canceled")
            )
        if not batch.cancel_requested:
            batch.cancel_requested = True
            batch.times["cancel_initiated_at"] = time.time()
        return web.json_response(self.object(batch), dumps=dumps)

    async def results(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if not batch.ended:
            return self.codec.error(
                refused(
                    f"Message Batch {batch.id} has not ended processing: its results are "
                    "available once processing_status is ended"
                )
            )
        lines = []
        for line in self.shuffled(batch):
            result: dict[str, Any] = {"type": line.outcome}
            if line.outcome == "succeeded":
                result["message"] = line.response
            elif line.outcome == "errored":
                result["error"] = line.response
            lines.append(orjson.dumps({"custom_id": line.custom_id, "result": result}) + b"\n")
        return web.Response(body=b"".join(lines), content_type="application/x-jsonl")

    async def list(self, request: web.Request) -> web.Response:
        if (denied := self._refused(request)) is not None:
            return denied
        owner = owner_of(request.headers, self.codec)
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            return self.codec.error(refused("limit: Input should be between 1 and 1000"))
        mine = [b for b in reversed(self.batches.values()) if b.owner == owner]
        ids = [b.id for b in mine]
        after, before = request.query.get("after_id"), request.query.get("before_id")
        if after is not None:
            mine = mine[ids.index(after) + 1 :] if after in ids else []
        elif before is not None:
            mine = mine[: ids.index(before)][-limit:] if before in ids else []
        page = mine[:limit]
        return web.json_response(
            {
                "data": [self.object(b) for b in page],
                "has_more": len(mine) > limit,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            },
            dumps=dumps,
        )
