"""The batch emulators over real HTTP: OpenAI's Batch API (`/v1/files` + `/v1/batches`) and
Anthropic's Message Batches (`/v1/messages/batches`): life cycle, `custom_id` pairing, errored,
expired and cancelled requests, refusals in each provider's shape, the one request pipeline
(quotas, faults, the same replies as direct calls) and the emulator's bill per tier."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from helpers import wait_for

from piserini_ray.offline import (
    BatchConfig,
    OfflineConfig,
    Policy,
    PolicyReply,
    PolicyToolCall,
    QuotaConfig,
    default_policies,
)
from piserini_ray_testkit import BatchFates, EmulatedProvider, Scripted

MODEL = "gpt-5.4-mini"
CLAUDE = "claude-haiku-4-5"
ECHO = "test/echo"
ALIASES = {MODEL: ECHO, CLAUDE: ECHO}
VERSION = {"anthropic-version": "2023-06-01"}
SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}


def echo_policy(request: dict[str, Any]) -> PolicyReply:
    """Answers each question with itself; searches when the question asks to."""
    question = str(request["messages"][-1]["content"])
    if question.startswith("search"):
        arguments = json.dumps({"query": question})
        return PolicyReply(tool_calls=[PolicyToolCall(name="search", arguments=arguments)])
    return PolicyReply(content=f"answer to {question}")


POLICIES: dict[str, Policy] = {ECHO: echo_policy}


def _provider(policies: dict[str, Policy] | None = None, **settings: Any) -> EmulatedProvider:
    """A provider serving `POLICIES` (or `policies`) under `ALIASES`; `batch` is a dict, and
    `fates` (`BatchFates`: its `error_rate` and `expire_rate`) a dict too."""
    batch = BatchConfig(**settings.pop("batch", {}))
    fates = BatchFates(**settings.pop("fates", {}))
    config = OfflineConfig(model_aliases=ALIASES, batch=batch, **settings)
    return EmulatedProvider(config, POLICIES if policies is None else policies, batch_fates=fates)


def _client(provider: EmulatedProvider, key: str = "k1", **headers: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{provider.port}",
        headers={"Authorization": f"Bearer {key}", "x-api-key": key, **headers},
        timeout=30,
    )


def _chat_line(custom_id: str, question: str, url: str = "/v1/chat/completions") -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _jsonl(lines: list[Any]) -> bytes:
    return b"".join(
        (line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines
    )


def _upload(client: httpx.Client, content: bytes, name: str = "input.jsonl") -> str:
    response = client.post("/v1/files", data={"purpose": "batch"}, files={"file": (name, content)})
    assert response.status_code == 200, response.text
    uploaded = response.json()
    assert uploaded["object"] == "file" and uploaded["purpose"] == "batch"
    assert uploaded["bytes"] == len(content) and uploaded["id"].startswith("file-")
    return str(uploaded["id"])


def _create(
    client: httpx.Client, lines: list[Any], endpoint: str = "/v1/chat/completions"
) -> dict[str, Any]:
    file_id = _upload(client, _jsonl(lines))
    response = client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"},
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def _poll(get: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool]) -> Any:
    deadline = time.monotonic() + 30
    seen = []
    while time.monotonic() < deadline:
        state = get()
        seen.append(state)
        if done(state):
            return state, seen
        time.sleep(0.02)
    raise AssertionError(f"batch never ended: {seen[-1]}")


def _openai_wait(client: httpx.Client, batch_id: str) -> tuple[dict[str, Any], list[Any]]:
    final = ("completed", "failed", "expired", "cancelled")
    return _poll(
        lambda: client.get(f"/v1/batches/{batch_id}").json(), lambda b: b["status"] in final
    )


def _file_lines(client: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    response = client.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200
    return [json.loads(line) for line in response.text.splitlines()]


def _anthropic_create(client: httpx.Client, requests: list[Any]) -> httpx.Response:
    return client.post("/v1/messages/batches", json={"requests": requests})


def _anthropic_request(custom_id: str, question: str, **params: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "params": {
            "model": CLAUDE,
            "max_tokens": 256,
            "messages": [{"role": "user", "content": question}],
            **params,
        },
    }


def _anthropic_wait(client: httpx.Client, batch_id: str) -> tuple[dict[str, Any], list[Any]]:
    return _poll(
        lambda: client.get(f"/v1/messages/batches/{batch_id}").json(),
        lambda b: b["processing_status"] == "ended",
    )


def _results(client: httpx.Client, batch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    response = client.get(batch["results_url"])
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert len({line["custom_id"] for line in lines}) == len(lines)
    return {line["custom_id"]: line["result"] for line in lines}


def _openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def _anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert response.headers["request-id"] == body["request_id"]
    assert body["error"]["type"] == kind
    return str(body["error"]["message"])


# ------------------------------------------------------------------------- OpenAI life cycle


def test_an_openai_batch_runs_its_life_cycle_and_pairs_outputs_by_custom_id() -> None:
    questions = {f"q-{i}": f"question {i}" for i in range(6)}
    with _provider(batch={"completion_seconds": 0.3}) as p, _client(p) as client:
        created = _create(client, [_chat_line(c, q) for c, q in questions.items()])
        assert created["status"] == "validating" and created["object"] == "batch"
        assert created["id"].startswith("batch_") and created["completion_window"] == "24h"
        assert created["expires_at"] == created["created_at"] + 24 * 3600
        final, seen = _openai_wait(client, created["id"])
        outputs = _file_lines(client, final["output_file_id"])
        records = p.requests
        bill = p.bill
    statuses = [s["status"] for s in seen]
    assert "in_progress" in statuses and statuses[-1] == "completed"
    assert final["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    assert final["error_file_id"] is None and final["model"] == MODEL
    for name in ("in_progress_at", "finalizing_at", "completed_at"):
        assert final[name] >= final["created_at"]
    assert sorted(o["custom_id"] for o in outputs) == sorted(questions)
    for output in outputs:
        assert output["id"].startswith("batch_req_") and output["error"] is None
        response = output["response"]
        assert response["status_code"] == 200 and response["request_id"]
        message = response["body"]["choices"][0]["message"]
        assert message["content"] == f"answer to {questions[output['custom_id']]}"
    # The same pipeline as a direct call, recorded and billed at the batch tier.
    assert [(r.route, r.status, r.service_tier, r.batch_id) for r in records] == [
        ("chat", 200, "batch", created["id"])
    ] * 6
    assert set(bill) == {("batch", MODEL)} and bill["batch", MODEL].requests == 6
    prompts = [r.usage.prompt_tokens for r in records if r.usage is not None]
    assert len(prompts) == 6 and bill["batch", MODEL].prompt_tokens == sum(prompts)


def test_the_openai_sdk_drives_the_emulator() -> None:
    """The official client parses every object the emulator sends."""
    openai = pytest.importorskip("openai")
    with _provider() as p:
        client = openai.OpenAI(base_url=p.base_url, api_key="k1", max_retries=0)
        uploaded = client.files.create(
            file=("in.jsonl", _jsonl([_chat_line("a", "one"), _chat_line("b", "two")])),
            purpose="batch",
        )
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"run": "test"},
        )
        batch_id = batch.id

        def ended() -> bool:
            nonlocal batch
            batch = client.batches.retrieve(batch_id)
            return batch.status in ("completed", "failed")

        wait_for("the batch to end", ended, 30)
        assert batch.status == "completed" and batch.metadata == {"run": "test"}
        assert batch.request_counts is not None and batch.request_counts.completed == 2
        assert batch.output_file_id is not None
        text = client.files.content(batch.output_file_id).text
        assert [b.id for b in client.batches.list().data] == [batch.id]
    assert sorted(json.loads(line)["custom_id"] for line in text.splitlines()) == ["a", "b"]


def test_a_client_that_disconnects_polls_the_same_batch_later() -> None:
    with _provider(batch={"completion_seconds": 0.5}) as p:
        with _client(p) as first:
            created = _create(first, [_chat_line(f"r{i}", f"q{i}") for i in range(3)])
        # The first client is gone; the batch runs on the emulator's clock.
        with _client(p) as later:
            final, _ = _openai_wait(later, created["id"])
            listed = later.get("/v1/batches").json()
            foreign = _client(p, key="other").get(f"/v1/batches/{created['id']}")
        records = p.requests
    assert final["status"] == "completed"
    assert [b["id"] for b in listed["data"]] == [created["id"]]  # never resubmitted
    assert listed["object"] == "list" and listed["has_more"] is False
    assert len(records) == 3  # each request ran once
    assert _openai_error(foreign, 404)["param"] == "batch_id"  # another key's batch is unknown


def test_an_openai_batch_can_be_cancelled() -> None:
    with _provider(batch={"completion_seconds": 5}) as p, _client(p) as client:
        created = _create(client, [_chat_line(f"r{i}", f"q{i}") for i in range(3)])
        cancelling = client.post(f"/v1/batches/{created['id']}/cancel").json()
        final, _ = _openai_wait(client, created["id"])
        errors = _file_lines(client, final["error_file_id"])
        again = client.post(f"/v1/batches/{created['id']}/cancel")
        bill = p.bill
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    assert final["status"] == "cancelled" and final["output_file_id"] is None
    assert final["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert all(e["response"] is None for e in errors)
    assert _openai_error(again, 400)["code"] == "invalid_state"
    assert bill == {}  # nothing ran, nothing billed


# ---------------------------------------------------------------------- Anthropic life cycle


def test_an_anthropic_batch_runs_its_life_cycle_and_pairs_results_by_custom_id() -> None:
    questions = {f"req_{i}": f"question {i}" for i in range(5)}
    with _provider(batch={"completion_seconds": 0.3}) as p, _client(p, **VERSION) as client:
        response = _anthropic_create(
            client, [_anthropic_request(c, q) for c, q in questions.items()]
        )
        assert response.status_code == 200, response.text
        created = response.json()
        early = client.get(
            created["results_url"] or f"/v1/messages/batches/{created['id']}/results"
        )
        final, _ = _anthropic_wait(client, created["id"])
        results = _results(client, final)
        listed = client.get("/v1/messages/batches").json()
        records = p.requests
        bill = p.bill
    assert created["type"] == "message_batch" and created["id"].startswith("msgbatch_")
    assert created["processing_status"] == "in_progress" and created["results_url"] is None
    assert created["request_counts"] == {
        "processing": 5,
        "succeeded": 0,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    _anthropic_error(early, 400, "invalid_request_error")  # no results before the end
    assert final["request_counts"]["succeeded"] == 5 and final["ended_at"] is not None
    assert final["results_url"].endswith(f"/v1/messages/batches/{created['id']}/results")
    assert set(results) == set(questions)
    for custom_id, result in results.items():
        assert result["type"] == "succeeded"
        assert result["message"]["type"] == "message"
        assert result["message"]["content"] == [
            {"type": "text", "text": f"answer to {questions[custom_id]}"}
        ]
    assert [b["id"] for b in listed["data"]] == [created["id"]]
    assert {(r.route, r.service_tier, r.batch_id) for r in records} == {
        ("messages", "batch", created["id"])
    }
    assert bill["batch", CLAUDE].requests == 5


def test_an_anthropic_batch_can_be_cancelled() -> None:
    with _provider(batch={"completion_seconds": 5}) as p, _client(p, **VERSION) as client:
        created = _anthropic_create(
            client, [_anthropic_request("a", "q"), _anthropic_request("b", "r")]
        ).json()
        canceling = client.post(f"/v1/messages/batches/{created['id']}/cancel").json()
        final, _ = _anthropic_wait(client, created["id"])
        results = _results(client, final)
        again = client.post(f"/v1/messages/batches/{created['id']}/cancel")
    assert canceling["processing_status"] == "canceling"
    assert canceling["cancel_initiated_at"] is not None
    assert final["request_counts"]["canceled"] == 2
    assert results == {"a": {"type": "canceled"}, "b": {"type": "canceled"}}
    _anthropic_error(again, 400, "invalid_request_error")


# -------------------------------------------------------------------- errored and expired


def _openai_fates(seed: int) -> tuple[dict[str, str], dict[str, Any], Any]:
    settings: dict[str, Any] = {"seed": seed, "fates": {"error_rate": 0.3, "expire_rate": 0.2}}
    with _provider(**settings) as p, _client(p) as client:
        created = _create(client, [_chat_line(f"r{i}", f"q{i}") for i in range(20)])
        final, _ = _openai_wait(client, created["id"])
        outputs = _file_lines(client, final["output_file_id"])
        errors = _file_lines(client, final["error_file_id"])
        bill = p.bill
    fates = {o["custom_id"]: "succeeded" for o in outputs}
    for line in errors:
        if line["error"] is not None:
            assert line["response"] is None
            fates[line["custom_id"]] = line["error"]["code"]
        else:
            assert line["response"]["status_code"] == 500
            assert line["response"]["body"]["error"]["type"] == "server_error"
            fates[line["custom_id"]] = "errored"
    return fates, final, bill


def test_openai_errored_and_expired_requests_follow_the_seed() -> None:
    fates, final, bill = _openai_fates(seed=3)
    assert sorted(fates) == sorted(f"r{i}" for i in range(20))  # every request, once
    kinds = sorted(set(fates.values()))
    assert kinds == ["batch_expired", "errored", "succeeded"]
    succeeded = sum(1 for f in fates.values() if f == "succeeded")
    assert final["status"] == "expired" and final["expired_at"] is not None
    assert final["request_counts"] == {
        "total": 20,
        "completed": succeeded,
        "failed": 20 - succeeded,
    }
    assert bill["batch", MODEL].requests == succeeded  # errored and expired are not billed
    again, _, _ = _openai_fates(seed=3)
    other, _, _ = _openai_fates(seed=4)
    assert again == fates and other != fates


def test_anthropic_errored_and_expired_requests_follow_the_seed() -> None:
    settings: dict[str, Any] = {"seed": 3, "fates": {"error_rate": 0.3, "expire_rate": 0.2}}
    requests = [_anthropic_request(f"r{i}", f"q{i}") for i in range(20)]
    requests.append(
        {"custom_id": "invalid", "params": {"model": CLAUDE, "messages": []}}  # checked late
    )
    with _provider(**settings) as p, _client(p, **VERSION) as client:
        created = _anthropic_create(client, requests).json()
        final, _ = _anthropic_wait(client, created["id"])
        results = _results(client, final)
        bill = p.bill
    assert len(results) == 21
    counts = final["request_counts"]
    types = [r["type"] for r in results.values()]
    for kind in ("succeeded", "errored", "expired"):
        assert counts[kind] == types.count(kind) > 0
    assert counts["processing"] == counts["canceled"] == 0
    for custom_id, result in results.items():
        if result["type"] == "errored":
            error = result["error"]
            assert error["type"] == "error" and error["request_id"].startswith("req_")
            if custom_id == "invalid":
                assert error["error"]["type"] == "invalid_request_error"
            else:
                assert error["error"]["type"] == "api_error"
        elif result["type"] == "expired":
            assert result == {"type": "expired"}
    assert bill["batch", CLAUDE].requests == counts["succeeded"]


# ---------------------------------------------------- the one pipeline: quotas, faults, replies


def test_a_quota_throttles_a_batch_without_failing_its_requests() -> None:
    quotas = QuotaConfig(requests_per_minute=2, window_seconds=0.5)
    with _provider(quotas=quotas) as p, _client(p) as client:
        created = _create(client, [_chat_line(f"r{i}", f"q{i}") for i in range(5)])
        final, _ = _openai_wait(client, created["id"])
        records = p.requests
    assert final["status"] == "completed" and final["request_counts"]["completed"] == 5
    refused = [r for r in records if r.fault == "quota"]
    assert refused and all(r.status == 429 and r.service_tier == "batch" for r in refused)


def test_a_scripted_fault_reaches_a_batch_request_as_it_would_a_direct_call() -> None:
    with _provider() as p, _client(p) as client:
        p.script(Scripted(kind="http_error", status=503))
        created = _create(client, [_chat_line(f"r{i}", f"q{i}") for i in range(3)])
        final, _ = _openai_wait(client, created["id"])
        errors = _file_lines(client, final["error_file_id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    [line] = errors
    assert line["response"]["status_code"] == 503
    assert line["response"]["body"]["error"]["type"] == "server_error"


def _without_ids(value: Any) -> Any:
    """A reply without what differs between any two calls (ids, times, usage)."""
    if isinstance(value, dict):
        drop = {"id", "created", "created_at", "usage", "call_id", "encrypted_content"}
        return {k: _without_ids(v) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


QUESTIONS = [
    "Which river flows through the city where the Louvre stands?",
    "Who wrote the novel that was adapted into the 1962 film about a lawyer in Alabama?",
]
TOOLS_CHAT = [{"type": "function", "function": {"name": "search", "parameters": SCHEMA}}]


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/responses"])
def test_an_openai_batch_replies_as_direct_calls_do(endpoint: str) -> None:
    """The seeded offline policies answer a batched request as they answer it directly."""
    aliases = {MODEL: "offline/heuristic"}
    if endpoint == "/v1/chat/completions":
        bodies = [
            {"model": MODEL, "messages": [{"role": "user", "content": q}], "tools": TOOLS_CHAT}
            for q in QUESTIONS
        ]
    else:
        tools = [{"type": "function", "name": "search", "parameters": SCHEMA}]
        bodies = [{"model": MODEL, "input": q, "tools": tools} for q in QUESTIONS]
    config = OfflineConfig(model_aliases=aliases)
    with EmulatedProvider(config, default_policies()) as p, _client(p) as client:
        direct = [client.post(endpoint, json=b).json() for b in bodies]
        lines = [
            {"custom_id": f"q{i}", "method": "POST", "url": endpoint, "body": b}
            for i, b in enumerate(bodies)
        ]
        final, _ = _openai_wait(client, _create(client, lines, endpoint)["id"])
        outputs = {o["custom_id"]: o for o in _file_lines(client, final["output_file_id"])}
        tiers = sorted(tier for tier, _ in p.bill)
    assert final["request_counts"]["completed"] == 2
    for i, reply in enumerate(direct):
        assert _without_ids(outputs[f"q{i}"]["response"]["body"]) == _without_ids(reply)
    assert tiers == ["batch", "standard"]


def test_an_anthropic_batch_replies_as_direct_calls_do() -> None:
    config = OfflineConfig(model_aliases={CLAUDE: "offline/heuristic"})
    tools = [{"name": "search", "description": "Search.", "input_schema": SCHEMA}]
    params = [
        {
            "model": CLAUDE,
            "max_tokens": 2048,
            "messages": [{"role": "user", "content": q}],
            "tools": tools,
        }
        for q in QUESTIONS
    ]
    with EmulatedProvider(config, default_policies()) as p, _client(p, **VERSION) as client:
        direct = [client.post("/v1/messages", json=body).json() for body in params]
        requests = [{"custom_id": f"q{i}", "params": body} for i, body in enumerate(params)]
        final, _ = _anthropic_wait(client, _anthropic_create(client, requests).json()["id"])
        results = _results(client, final)
        bill = p.bill
    for i, reply in enumerate(direct):
        assert results[f"q{i}"]["type"] == "succeeded"
        assert _without_ids(results[f"q{i}"]["message"]) == _without_ids(reply)
    assert bill["standard", CLAUDE].requests == bill["batch", CLAUDE].requests == 2
    assert bill["standard", CLAUDE].prompt_tokens == bill["batch", CLAUDE].prompt_tokens


def test_the_service_tier_of_a_direct_openai_call_is_on_the_bill() -> None:
    with _provider() as p, _client(p) as client:
        body = _chat_line("x", "hello")["body"]
        assert (
            client.post("/v1/chat/completions", json=body | {"service_tier": "flex"}).status_code
            == 200
        )
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        bill = p.bill
    assert bill["flex", MODEL].requests == bill["standard", MODEL].requests == 1


# ------------------------------------------------------------ refusals, in each provider's shape


def test_openai_refuses_malformed_batch_requests_at_once() -> None:
    with _provider() as p, _client(p) as client:
        file_id = _upload(client, _jsonl([_chat_line("a", "q")]))
        create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
        missing = client.post("/v1/batches", json=create)
        window = client.post("/v1/batches", json=create | {"completion_window": "48h"})
        endpoint = client.post(
            "/v1/batches",
            json=create | {"completion_window": "24h", "endpoint": "/v1/embeddings"},
        )
        unknown_arg = client.post(
            "/v1/batches", json=create | {"completion_window": "24h", "priority": 1}
        )
        unknown_file = client.post(
            "/v1/batches",
            json=create | {"completion_window": "24h", "input_file_id": "file-nope"},
        )
        metadata = client.post(
            "/v1/batches",
            json=create | {"completion_window": "24h", "metadata": {"k": "v" * 513}},
        )
        unknown_batch = client.get("/v1/batches/batch_nope")
        cancel_unknown = client.post("/v1/batches/batch_nope/cancel")
        not_jsonl = client.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": ("in.txt", b"{}")}
        )
        no_purpose = client.post("/v1/files", files={"file": ("in.jsonl", b"{}")})
        no_key = httpx.get(f"http://127.0.0.1:{p.port}/v1/batches")
    assert _openai_error(missing, 400) == {
        "message": "Missing required parameter: 'completion_window'.",
        "type": "invalid_request_error",
        "param": "completion_window",
        "code": "missing_required_parameter",
    }
    assert _openai_error(window, 400)["param"] == "completion_window"
    assert _openai_error(endpoint, 400)["param"] == "endpoint"
    assert _openai_error(unknown_arg, 400)["code"] == "unknown_parameter"
    assert _openai_error(unknown_file, 404)["param"] == "input_file_id"
    assert _openai_error(metadata, 400)["param"] == "metadata"
    assert _openai_error(unknown_batch, 404)["message"] == "No batch found with id 'batch_nope'."
    _openai_error(cancel_unknown, 404)
    assert "Must be .jsonl" in _openai_error(not_jsonl, 400)["message"]
    assert _openai_error(no_purpose, 400)["param"] == "purpose"
    assert no_key.status_code == 200  # keys are required only with `require_key`
    with _provider(require_key=True) as p:
        refused = httpx.get(f"http://127.0.0.1:{p.port}/v1/batches")
    assert _openai_error(refused, 401)["type"] == "authentication_error"


BAD_FILES: dict[str, tuple[list[Any], str, int | None]] = {
    "duplicate custom_id": (
        [_chat_line("a", "q"), _chat_line("a", "r")],
        "duplicate_custom_id",
        2,
    ),
    "a line that is not JSON": ([_chat_line("a", "q"), b"{not json"], "invalid_json_line", 2),
    "a url that is not the endpoint": (
        [_chat_line("a", "q", url="/v1/responses")],
        "url_mismatch",
        1,
    ),
    "a method other than POST": (
        [_chat_line("a", "q") | {"method": "GET"}],
        "invalid_method",
        1,
    ),
    "no custom_id": (
        [{k: v for k, v in _chat_line("a", "q").items() if k != "custom_id"}],
        "missing_required_parameter",
        1,
    ),
    "two models": (
        [_chat_line("a", "q"), {**_chat_line("b", "q"), "body": {"model": "other"}}],
        "model_mismatch",
        2,
    ),
    "an empty file": ([], "empty_file", None),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_openai_fails_a_batch_whose_file_the_api_refuses(case: str) -> None:
    lines, code, line = BAD_FILES[case]
    with _provider() as p, _client(p) as client:
        file_id = _upload(client, _jsonl(lines))
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).json()
        final, _ = _openai_wait(client, created["id"])
        records = p.requests
    assert created["status"] == "validating"
    assert final["status"] == "failed" and final["failed_at"] is not None
    assert final["output_file_id"] is None and final["error_file_id"] is None
    [error] = final["errors"]["data"]
    assert (error["code"], error["line"]) == (code, line)
    assert records == []  # nothing ran


def test_openai_fails_a_batch_of_more_than_50000_requests() -> None:
    line = orjson.dumps(_chat_line("x", "q")).replace(b'"x"', b'"r%d"')
    content = b"\n".join(line % i for i in range(50_001))
    with _provider() as p, _client(p) as client:
        file_id = _upload(client, content)
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).json()
        final, _ = _openai_wait(client, created["id"])
    [error] = final["errors"]["data"]
    assert final["status"] == "failed" and error["code"] == "too_many_tasks"
    assert "50,000" in error["message"]


def test_openai_refuses_an_input_file_over_the_byte_limit() -> None:
    with _provider(batch={"max_bytes": 100}) as p, _client(p) as client:
        response = client.post(
            "/v1/files",
            data={"purpose": "batch"},
            files={"file": ("in.jsonl", _jsonl([_chat_line("a", "q" * 200)]))},
        )
    assert _openai_error(response, 400)["param"] == "file"


def test_anthropic_refuses_malformed_batch_requests() -> None:
    good = _anthropic_request("a", "q")
    with _provider(batch={"max_bytes": 20_000}) as p, _client(p, **VERSION) as client:
        cases = {
            "duplicate": _anthropic_create(client, [good, good]),
            "pattern": _anthropic_create(client, [_anthropic_request("has space", "q")]),
            "too long": _anthropic_create(client, [_anthropic_request("x" * 65, "q")]),
            "empty": _anthropic_create(client, []),
            "no params": _anthropic_create(client, [{"custom_id": "a"}]),
            "extra": client.post("/v1/messages/batches", json={"requests": [good], "x": 1}),
            "not json": client.post("/v1/messages/batches", content=b"{nope"),
        }
        too_large = _anthropic_create(client, [_anthropic_request("a", "q" * 30_000)])
        unknown = client.get("/v1/messages/batches/msgbatch_nope")
        unknown_results = client.get("/v1/messages/batches/msgbatch_nope/results")
        no_version = httpx.post(
            f"http://127.0.0.1:{p.port}/v1/messages/batches",
            json={"requests": [good]},
            headers={"x-api-key": "k1"},
        )
        listed = client.get("/v1/messages/batches").json()
    for name, response in cases.items():
        message = _anthropic_error(response, 400, "invalid_request_error")
        assert message, name
    assert "Duplicate custom_id" in _anthropic_error(
        cases["duplicate"], 400, "invalid_request_error"
    )
    assert "^[a-zA-Z0-9_-]{1,64}$" in _anthropic_error(
        cases["pattern"], 400, "invalid_request_error"
    )
    _anthropic_error(too_large, 413, "request_too_large")
    _anthropic_error(unknown, 404, "not_found_error")
    _anthropic_error(unknown_results, 404, "not_found_error")
    assert "anthropic-version" in _anthropic_error(no_version, 400, "invalid_request_error")
    assert listed["data"] == []  # nothing refused was created


def test_anthropic_refuses_a_batch_of_more_than_100000_requests() -> None:
    request = {"custom_id": "r", "params": {}}
    requests = [request | {"custom_id": f"r{i}"} for i in range(100_001)]
    with _provider() as p, _client(p, **VERSION) as client:
        response = _anthropic_create(client, requests)
    message = _anthropic_error(response, 400, "invalid_request_error")
    assert "at most 100000 items" in message
