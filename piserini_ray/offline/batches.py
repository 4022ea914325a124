"""The batch emulators of the offline provider: OpenAI's Batch API (`/v1/files` + `/v1/batches`)
and Anthropic's Message Batches (`/v1/messages/batches`), as strict as the published APIs.

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
each request draws its fate from a seeded RNG (`offline.seed`): errored (`error_rate`: a server
error, not billed) or expired (`expire_rate`: never run, not billed). Results come out in a
seeded shuffled order, as both providers warn they may: pair them by `custom_id`.

OpenAI (https://platform.openai.com/docs/api-reference/batch,
https://platform.openai.com/docs/api-reference/files, https://platform.openai.com/docs/guides/batch):
- `POST /v1/files` (multipart: `file`, `purpose`); purpose `batch` requires a `.jsonl` file
  ("Invalid file format for Batch API. Must be .jsonl") of at most 200 MB.
- `POST /v1/batches`: `input_file_id`, `endpoint` (`/v1/chat/completions` or `/v1/responses`
  here), `completion_window` (only `24h`), optional `metadata` (at most 16 pairs, keys up to 64
  and values up to 512 characters); other parameters are refused. A request the API refuses at
  once is a 400 (404 for an unknown file); the file's content is checked after creation, as
  the API does: the batch goes `validating` -> `failed` with `errors.data` of `{code, message,
  param, line}` (`empty_file`, `invalid_json_line`, `missing_required_parameter`,
  `invalid_method`, `duplicate_custom_id`, `url_mismatch`, `model_mismatch`,
  `too_many_tasks` above 50,000 requests: one input file serves one model).
- Otherwise `validating` -> `in_progress` -> `finalizing` -> `completed` (`expired` when a
  request expired; `cancelling` -> `cancelled` after `POST /v1/batches/{id}/cancel`), with
  `request_counts {total, completed, failed}`. Successes go to `output_file_id`, failures to
  `error_file_id`: JSONL lines `{id, custom_id, response: {status_code, request_id, body},
  error}`; an expired or cancelled request has `response: null` and `error: {code:
  batch_expired | batch_cancelled, message}`.
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
Errors are each provider's own shape (`openai_format.py`, `anthropic.py`); a batch or file of
another key is unknown (404), as another organisation's is.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import secrets
import string
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

import orjson
from aiohttp import web
from multidict import CIMultiDict

from piserini_ray.config.offline import BatchConfig
from piserini_ray.offline.codec import Codec, Problem, decode_json_object, refused

#: Published limits (see the module docstring).
OPENAI_MAX_REQUESTS = 50_000
OPENAI_MAX_BYTES = 200 * 1024**2
ANTHROPIC_MAX_REQUESTS = 100_000
ANTHROPIC_MAX_BYTES = 256 * 1024**2
#: The completion window both providers give a batch (expires_at).
WINDOW_SECONDS = 24 * 3600
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
#: Longest wait on a quota window's `retry-after` before a batch request is tried again.
MAX_QUOTA_WAIT = 60.0

#: Runs one request of a batch through the pipeline: (codec, the creator's headers, the body,
#: the batch id) -> the response a direct call would get.
LineRunner = Callable[[Codec, Mapping[str, str], bytes, str], Awaitable[web.Response]]
Fate = Literal["run", "errored", "expired"]
Outcome = Literal["succeeded", "errored", "expired", "canceled"]


def _owner(headers: Mapping[str, str], codec: Codec) -> str:
    """Who a batch or file belongs to: a hash of the key it was created with."""
    return hashlib.sha256((codec.api_key(headers) or "").encode()).hexdigest()[:16]


def _token(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


_ALNUM = string.ascii_letters + string.digits


def _rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json(response: web.Response) -> dict[str, Any]:
    body = response.body
    return cast(dict[str, Any], orjson.loads(cast(bytes, body))) if body else {}


def _dumps(obj: Any) -> str:
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


class _Emulator:
    """What both emulators share: fates, the worker, the tasks, the ids' owners."""

    def __init__(self, config: BatchConfig, seed: int, run_line: LineRunner) -> None:
        self.config = config
        self.seed = seed
        self.run_line = run_line
        self.batches: dict[str, Batch] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.reseed()

    def reseed(self) -> None:
        self.rng = random.Random(f"{self.seed}:batches")

    def fates(self, n: int) -> list[Fate]:
        """Each request's fate, drawn in order when the batch is created (one draw each)."""
        fates: list[Fate] = []
        for _ in range(n):
            draw = self.rng.random()
            if draw < self.config.expire_rate:
                fates.append("expired")
            elif draw < self.config.expire_rate + self.config.error_rate:
                fates.append("errored")
            else:
                fates.append("run")
        return fates

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
            batch if batch is not None and batch.owner == _owner(request.headers, codec) else None
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
                line.outcome, line.status, line.response = "errored", 500, _json(response)
                line.request_id = _request_id(response)
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
        line.status, line.response = response.status, _json(response)
        line.request_id = _request_id(response)
        line.outcome = "succeeded" if response.status == 200 else "errored"

    def shuffled(self, batch: Batch) -> list[Line]:
        """The lines in the seeded order their results come out in."""
        lines = list(batch.lines)
        random.Random(f"{self.seed}:order:{batch.id}").shuffle(lines)
        return lines


def _request_id(response: web.Response) -> str:
    return (
        response.headers.get("request-id")
        or response.headers.get("x-request-id")
        or f"req_{secrets.token_hex(16)}"
    )


# ------------------------------------------------------------------------------------ OpenAI


@dataclass
class StoredFile:
    id: str
    owner: str
    filename: str
    purpose: str
    content: bytes
    created: int

    def object(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


def _openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }
    return web.json_response(body, status=status, dumps=_dumps)


class OpenAIBatches(_Emulator):
    """OpenAI's Files (for batches) and Batch API."""

    def __init__(
        self,
        config: BatchConfig,
        seed: int,
        run_line: LineRunner,
        codecs: Mapping[str, Codec],
        require_key: bool,
    ) -> None:
        super().__init__(config, seed, run_line)
        self.codecs = dict(codecs)  # endpoint -> codec
        self.auth = self.codecs["/v1/chat/completions"]
        self.require_key = require_key
        self.files: dict[str, StoredFile] = {}
        self.max_requests = min(OPENAI_MAX_REQUESTS, config.max_requests or OPENAI_MAX_REQUESTS)
        self.max_bytes = min(OPENAI_MAX_BYTES, config.max_bytes or OPENAI_MAX_BYTES)

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if self.require_key and self.auth.api_key(request.headers) is None:
            return self.auth.error(self.auth.missing_key())
        return None

    # -- files ----------------------------------------------------------------------------

    async def upload_file(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        if not request.content_type.startswith("multipart/form-data"):
            return _openai_error(400, "The request must be multipart/form-data.")
        form = await request.post()
        upload = form.get("file")
        purpose = form.get("purpose")
        if purpose is None or not isinstance(purpose, str):
            return _openai_error(
                400,
                "Missing required parameter: 'purpose'.",
                "purpose",
                "missing_required_parameter",
            )
        if not isinstance(upload, web.FileField):
            return _openai_error(
                400, "Missing required parameter: 'file'.", "file", "missing_required_parameter"
            )
        if purpose not in FILE_PURPOSES:
            return _openai_error(
                400,
                f"Invalid value for 'purpose': '{purpose}'. Supported values are: "
                + ", ".join(f"'{p}'" for p in FILE_PURPOSES)
                + ".",
                "purpose",
                "invalid_value",
            )
        content = upload.file.read()
        if purpose == "batch":
            if not upload.filename.endswith(".jsonl"):
                return _openai_error(400, "Invalid file format for Batch API. Must be .jsonl")
            if len(content) > self.max_bytes:
                return _openai_error(
                    400,
                    f"File is too large: {len(content):,} bytes; a batch input file can be up "
                    f"to {self.max_bytes:,} bytes.",
                    "file",
                )
        stored = StoredFile(
            f"file-{_token(_ALNUM, 22)}",
            _owner(request.headers, self.auth),
            upload.filename,
            str(purpose),
            content,
            int(time.time()),
        )
        self.files[stored.id] = stored
        return web.json_response(stored.object(), dumps=_dumps)

    def _file(self, request: web.Request) -> StoredFile | web.Response:
        file_id = request.match_info["file_id"]
        stored = self.files.get(file_id)
        if stored is None or stored.owner != _owner(request.headers, self.auth):
            return _openai_error(404, f"No such File object: {file_id}", "id")
        return stored

    async def get_file(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        stored = self._file(request)
        return stored if isinstance(stored, web.Response) else web.json_response(stored.object())

    async def file_content(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        return web.Response(body=stored.content, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        del self.files[stored.id]
        return web.json_response({"id": stored.id, "object": "file", "deleted": True})

    # -- batches --------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as error:
            return _openai_error(400, f"We could not parse the JSON body of your request: {error}")
        if not isinstance(body, dict):
            return _openai_error(400, "The request body must be a JSON object.")
        allowed = ("input_file_id", "endpoint", "completion_window", "metadata")
        for name in body:
            if name not in (*allowed, "output_expires_after"):
                return _openai_error(
                    400,
                    f"Unrecognized request argument supplied: {name}",
                    name,
                    "unknown_parameter",
                )
        for name in allowed[:3]:
            if name not in body:
                return _openai_error(
                    400,
                    f"Missing required parameter: '{name}'.",
                    name,
                    "missing_required_parameter",
                )
        endpoint, window = body["endpoint"], body["completion_window"]
        if window != "24h":
            return _openai_error(
                400,
                f"Invalid value: '{window}'. Supported values are: '24h'.",
                "completion_window",
                "invalid_value",
            )
        if endpoint not in OPENAI_ENDPOINTS:
            return _openai_error(
                400,
                f"Invalid value: '{endpoint}'. Supported values are: "
                + ", ".join(f"'{e}'" for e in OPENAI_ENDPOINTS)
                + " (the endpoints the offline provider serves).",
                "endpoint",
                "invalid_value",
            )
        metadata = body.get("metadata")
        if metadata is not None and not _valid_metadata(metadata):
            return _openai_error(
                400,
                f"Invalid 'metadata': at most {METADATA_PAIRS} string pairs, keys up to "
                f"{METADATA_KEY} and values up to {METADATA_VALUE} characters.",
                "metadata",
                "invalid_value",
            )
        file_id = body["input_file_id"]
        stored = self.files.get(file_id) if isinstance(file_id, str) else None
        if stored is None or stored.owner != _owner(request.headers, self.auth):
            return _openai_error(404, f"No such File object: {file_id}", "input_file_id")
        if stored.purpose != "batch":
            return _openai_error(
                400,
                f"The file {file_id} has purpose '{stored.purpose}'; a batch needs purpose "
                "'batch'.",
                "input_file_id",
            )
        lines, errors = self._validate(stored.content, str(endpoint))
        now = time.time()
        batch = Batch(
            f"batch_{secrets.token_hex(16)}",
            _owner(request.headers, self.auth),
            self.codecs[str(endpoint)],
            CIMultiDict(request.headers),
            lines,
            now,
            data={
                "endpoint": endpoint,
                "input_file_id": stored.id,
                "metadata": metadata,
                "status": "validating",
                "errors": errors,
                "model": lines[0].body.get("model") if lines and not errors else None,
                "output_file_id": None,
                "error_file_id": None,
            },
        )
        self.start(batch)
        return web.json_response(self.object(batch), dumps=_dumps)

    def _validate(self, content: bytes, endpoint: str) -> tuple[list[Line], list[dict[str, Any]]]:
        """The requests of an input file, or the errors that fail its batch (with lines)."""
        raw_lines = content.split(b"\n")
        if raw_lines and not raw_lines[-1].strip():
            raw_lines.pop()  # the file's final newline
        errors: list[dict[str, Any]] = []

        def error(code: str, message: str, line: int | None, param: str | None = None) -> None:
            errors.append({"code": code, "message": message, "param": param, "line": line})

        if not raw_lines:
            error("empty_file", "The batch input file is empty.", None)
            return [], errors
        if len(raw_lines) > self.max_requests:
            error(
                "too_many_tasks",
                f"The batch input file has {len(raw_lines):,} requests; a batch can have at "
                f"most {self.max_requests:,}.",
                None,
            )
            return [], errors
        parsed: list[tuple[str, dict[str, Any]]] = []
        seen: set[str] = set()
        models: set[str] = set()
        for number, raw in enumerate(raw_lines, 1):
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                error("invalid_json_line", "This line is not parseable as valid JSON.", number)
                continue
            if not isinstance(item, dict):
                error("invalid_json_line", "This line is not a JSON object.", number)
                continue
            missing = [k for k in ("custom_id", "method", "url", "body") if k not in item]
            if missing:
                error(
                    "missing_required_parameter",
                    f"Missing required parameter: '{missing[0]}'.",
                    number,
                    missing[0],
                )
                continue
            custom_id, body = item["custom_id"], item["body"]
            if not isinstance(custom_id, str) or not custom_id:
                error("invalid_value", "custom_id must be a non-empty string.", number, "custom_id")
                continue
            if item["method"] != "POST":
                error(
                    "invalid_method",
                    f"Invalid method '{item['method']}': batch requests use POST.",
                    number,
                    "method",
                )
                continue
            if item["url"] != endpoint:
                error(
                    "url_mismatch",
                    f"The URL '{item['url']}' of this request does not match the batch's "
                    f"endpoint '{endpoint}'.",
                    number,
                    "url",
                )
                continue
            if not isinstance(body, dict):
                error("invalid_value", "body must be a JSON object.", number, "body")
                continue
            if custom_id in seen:
                error(
                    "duplicate_custom_id",
                    f"The custom_id '{custom_id}' of this request is a duplicate of another "
                    "request's. The custom_id parameter must be unique for each request in a "
                    "batch.",
                    number,
                    "custom_id",
                )
                continue
            seen.add(custom_id)
            models.add(str(body.get("model")))
            if len(models) > 1:
                error(
                    "model_mismatch",
                    "The model of this request differs from the model of the requests before "
                    "it: an input file serves one model.",
                    number,
                    "body.model",
                )
                continue
            parsed.append((custom_id, body))
        if errors:
            return [], errors
        fates = self.fates(len(parsed))
        return [Line(c, b, f) for (c, b), f in zip(parsed, fates, strict=True)], []

    async def _work(self, batch: Batch) -> None:
        data = batch.data
        await asyncio.sleep(0)
        if data["errors"]:
            data["status"] = "failed"
            batch.times["failed_at"] = time.time()
            batch.ended = True
            return
        if batch.cancel_requested:
            await self._finish(batch)
            return
        data["status"] = "in_progress"
        batch.times["in_progress_at"] = time.time()
        await self.run_lines(batch, lambda line: None)
        await self._finish(batch)

    async def _finish(self, batch: Batch) -> None:
        """Write the output and error files, and end the batch."""
        data = batch.data
        cancelled = batch.cancel_requested
        if not cancelled:
            data["status"] = "finalizing"
            batch.times["finalizing_at"] = time.time()
            await asyncio.sleep(0)
        for line in batch.lines:
            if line.outcome is None:
                line.outcome = "canceled"
        outputs: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for line in self.shuffled(batch):
            entry: dict[str, Any] = {
                "id": f"batch_req_{secrets.token_hex(16)}",
                "custom_id": line.custom_id,
                "response": None,
                "error": None,
            }
            if line.outcome in ("succeeded", "errored"):
                entry["response"] = {
                    "status_code": line.status,
                    "request_id": line.request_id,
                    "body": line.response,
                }
            elif line.outcome == "expired":
                entry["error"] = {
                    "code": "batch_expired",
                    "message": "This request could not be executed before the completion "
                    "window expired.",
                }
            else:
                entry["error"] = {
                    "code": "batch_cancelled",
                    "message": "This request was not executed because the batch was cancelled.",
                }
            (outputs if line.outcome == "succeeded" else failures).append(entry)
        now = int(time.time())
        for name, entries in (("output_file_id", outputs), ("error_file_id", failures)):
            if entries:
                content = b"".join(orjson.dumps(e) + b"\n" for e in entries)
                stored = StoredFile(
                    f"file-{_token(_ALNUM, 22)}",
                    batch.owner,
                    f"{batch.id}_{name.split('_')[0]}.jsonl",
                    "batch_output",
                    content,
                    now,
                )
                self.files[stored.id] = stored
                data[name] = stored.id
        if cancelled:
            data["status"] = "cancelled"
            batch.times["cancelled_at"] = time.time()
        elif any(line.outcome == "expired" for line in batch.lines):
            data["status"] = "expired"
            batch.times["expired_at"] = time.time()
        else:
            data["status"] = "completed"
            batch.times["completed_at"] = time.time()
        batch.ended = True

    def object(self, batch: Batch) -> dict[str, Any]:
        data = batch.data
        done = [line for line in batch.lines if line.outcome is not None]
        completed = sum(1 for line in done if line.outcome == "succeeded")

        def at(name: str) -> int | None:
            moment = batch.times.get(name)
            return int(moment) if moment is not None else None

        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": data["endpoint"],
            "model": data["model"],
            "errors": {"object": "list", "data": data["errors"]} if data["errors"] else None,
            "input_file_id": data["input_file_id"],
            "completion_window": "24h",
            "status": data["status"],
            "output_file_id": data["output_file_id"],
            "error_file_id": data["error_file_id"],
            "created_at": int(batch.created),
            "in_progress_at": at("in_progress_at"),
            "expires_at": int(batch.created) + WINDOW_SECONDS,
            "finalizing_at": at("finalizing_at"),
            "completed_at": at("completed_at"),
            "failed_at": at("failed_at"),
            "expired_at": at("expired_at"),
            "cancelling_at": at("cancelling_at"),
            "cancelled_at": at("cancelled_at"),
            "request_counts": {
                "total": len(batch.lines),
                "completed": completed,
                "failed": len(done) - completed,
            },
            "metadata": data["metadata"],
        }

    def _batch(self, request: web.Request) -> Batch | web.Response:
        batch = self.find(request, self.auth)
        if batch is None:
            batch_id = request.match_info["batch_id"]
            return _openai_error(404, f"No batch found with id '{batch_id}'.", "batch_id")
        return batch

    async def retrieve(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        return web.json_response(self.object(batch), dumps=_dumps)

    async def cancel(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        status = batch.data["status"]
        if batch.ended or status in ("cancelling", "finalizing"):
            return _openai_error(
                400, f"Cannot cancel a batch with status '{status}'.", None, "invalid_state"
            )
        batch.cancel_requested = True
        batch.data["status"] = "cancelling"
        batch.times["cancelling_at"] = time.time()
        return web.json_response(self.object(batch), dumps=_dumps)

    async def list(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        owner = _owner(request.headers, self.auth)
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            return _openai_error(
                400, "Invalid 'limit': an integer from 1 to 100.", "limit", "invalid_value"
            )
        mine = [b for b in reversed(self.batches.values()) if b.owner == owner]
        after = request.query.get("after")
        if after is not None:
            ids = [b.id for b in mine]
            mine = mine[ids.index(after) + 1 :] if after in ids else []
        page = mine[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": [self.object(b) for b in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(mine) > limit,
            },
            dumps=_dumps,
        )


def _valid_metadata(metadata: Any) -> bool:
    return (
        isinstance(metadata, dict)
        and len(metadata) <= METADATA_PAIRS
        and all(
            isinstance(k, str)
            and len(k) <= METADATA_KEY
            and isinstance(v, str)
            and len(v) <= METADATA_VALUE
            for k, v in metadata.items()
        )
    )


# --------------------------------------------------------------------------------- Anthropic


class AnthropicBatches(_Emulator):
    """Anthropic's Message Batches (errors rendered by the Messages codec)."""

    def __init__(
        self, config: BatchConfig, seed: int, run_line: LineRunner, codec: Codec, require_key: bool
    ) -> None:
        super().__init__(config, seed, run_line)
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
            f"msgbatch_{_token(_ALNUM, 24)}",
            _owner(request.headers, self.codec),
            self.codec,
            CIMultiDict(request.headers),
            [Line(c, p, f) for (c, p), f in zip(requests, fates, strict=True)],
            time.time(),
            data={"results_url": None, "base": f"{request.scheme}://{request.host}"},
        )
        self.start(batch)
        return web.json_response(self.object(batch), dumps=_dumps)

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
            return _rfc3339(moment) if moment is not None else None

        status = (
            "ended" if batch.ended else "canceling" if batch.cancel_requested else ("in_progress")
        )
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "ended_at": at("ended_at"),
            "created_at": _rfc3339(batch.created),
            "expires_at": _rfc3339(batch.created + WINDOW_SECONDS),
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
        return web.json_response(self.object(batch), dumps=_dumps)

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
        return web.json_response(self.object(batch), dumps=_dumps)

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
        owner = _owner(request.headers, self.codec)
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
            dumps=_dumps,
        )
