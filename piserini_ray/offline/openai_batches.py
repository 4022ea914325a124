"""The offline provider's emulator of OpenAI's Batch API (`/v1/files` + `/v1/batches`), as
strict as the published API; what both batch emulators share is `batch_emulator.py`.

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
Errors are OpenAI's own shape (`openai_format.py`); a batch or file of another key is unknown
(404), as another organisation's is.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
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
)
from piserini_ray.offline.codec import Codec

#: Published limits (see the module docstring).
OPENAI_MAX_REQUESTS = 50_000
OPENAI_MAX_BYTES = 200 * 1024**2
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512


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
    return web.json_response(body, status=status, dumps=dumps)


def _refused_parameters(body: dict[str, Any]) -> web.Response | None:
    """A create request's parameters as OpenAI checks them: its refusal, or None."""
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
    return None


#: A line's refusal: (code, message, param).
LineProblem = tuple[str, str, str | None]


def _line_item(raw: bytes, endpoint: str) -> tuple[dict[str, Any], LineProblem | None]:
    """A line of an input file on its own: the request it holds, or why it is refused."""
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}, ("invalid_json_line", "This line is not parseable as valid JSON.", None)
    if not isinstance(item, dict):
        return {}, ("invalid_json_line", "This line is not a JSON object.", None)
    missing = [k for k in ("custom_id", "method", "url", "body") if k not in item]
    if missing:
        message = f"Missing required parameter: '{missing[0]}'."
        return item, ("missing_required_parameter", message, missing[0])
    custom_id = item["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        return item, ("invalid_value", "custom_id must be a non-empty string.", "custom_id")
    if item["method"] != "POST":
        message = f"Invalid method '{item['method']}': batch requests use POST."
        return item, ("invalid_method", message, "method")
    if item["url"] != endpoint:
        message = (
            f"The URL '{item['url']}' of this request does not match the batch's "
            f"endpoint '{endpoint}'."
        )
        return item, ("url_mismatch", message, "url")
    if not isinstance(item["body"], dict):
        return item, ("invalid_value", "body must be a JSON object.", "body")
    return item, None


class OpenAIBatchEmulator(BatchEmulator):
    """OpenAI's Files (for batches) and Batch API."""

    def __init__(
        self,
        config: BatchConfig,
        seed: int,
        run_line: LineRunner,
        codecs: Mapping[str, Codec],
        require_key: bool,
        fates: FateDraw | None = None,
    ) -> None:
        super().__init__(config, seed, run_line, fates)
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
            f"file-{random_token(ALNUM, 22)}",
            owner_of(request.headers, self.auth),
            upload.filename,
            str(purpose),
            content,
            int(time.time()),
        )
        self.files[stored.id] = stored
        return web.json_response(stored.object(), dumps=dumps)

    def _file(self, request: web.Request) -> StoredFile | web.Response:
        file_id = request.match_info["file_id"]
        stored = self.files.get(file_id)
        if stored is None or stored.owner != owner_of(request.headers, self.auth):
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
        if (refusal := _refused_parameters(body)) is not None:
            return refusal
        endpoint, metadata = body["endpoint"], body.get("metadata")
        file_id = body["input_file_id"]
        stored = self.files.get(file_id) if isinstance(file_id, str) else None
        if stored is None or stored.owner != owner_of(request.headers, self.auth):
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
            owner_of(request.headers, self.auth),
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
        return web.json_response(self.object(batch), dumps=dumps)

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
            item, problem = _line_item(raw, endpoint)
            if problem is not None:
                error(problem[0], problem[1], number, problem[2])
                continue
            custom_id, body = item["custom_id"], item["body"]
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
                    f"file-{random_token(ALNUM, 22)}",
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
        return web.json_response(self.object(batch), dumps=dumps)

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
        return web.json_response(self.object(batch), dumps=dumps)

    async def list(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        owner = owner_of(request.headers, self.auth)
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
            dumps=dumps,
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
