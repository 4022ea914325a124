"""Each query as an OpenTelemetry trace with the GenAI conventions, held by a real trace
backend that users use: Phoenix (from PyPI, in its own environment: `make phoenix`, which
`.ci/run` runs), started by the test on loopback. A run on Ray sends them, and the traces
Phoenix holds match the records span for span; a collector that is down costs the run nothing
and is said once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers import wait_for

from piserini_ray.config import RunConfig
from piserini_ray.monitor.otlp import traces_endpoint
from piserini_ray.monitor.traces import TraceExporter
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.records import QueryRecord, Turn, Usage, now_iso

ROOT = Path(__file__).parents[2]
PHOENIX = os.environ.get("PISERINI_RAY_PHOENIX") or str(ROOT / ".venv-phoenix/bin/phoenix")
MODEL = "gpt-5.4-mini"
KEY = "sk-test-traces-4242424242"
QUERIES = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_endpoint_comes_from_the_config_or_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert traces_endpoint(RunConfig()) is None  # off by default
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")
    assert traces_endpoint(RunConfig()) == "http://127.0.0.1:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://h:1/custom")
    assert traces_endpoint(RunConfig()) == "http://h:1/custom"
    config = RunConfig.model_validate({"runtime": {"traces_endpoint": "http://c:6006"}})
    assert traces_endpoint(config) == "http://c:6006/v1/traces"


def test_a_collector_that_is_down_is_said_once_and_costs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said: list[str] = []
    exporter = TraceExporter(
        "run",
        RunConfig(),
        None,
        {"q1", "q2"},
        f"http://127.0.0.1:{_free_port()}/v1/traces",
        said.append,
    )
    for query_id in ("q1", "q2"):
        record = QueryRecord(
            run_id="r", config_hash="h", query_id=query_id, model="m", status="completed",
            started_at=now_iso(), finished_at=now_iso(),
            trajectory=[Turn(index=1, model_output="x", usage=Usage(input_tokens=5))],
        )  # fmt: skip
        exporter.recorded(record)  # returns at once: spans go out at the end
    exporter.close()  # returns at once too: the flush goes on in its own thread
    assert exporter.flushed()
    dropped = [m for m in said if "traces are dropped" in m]
    assert len(dropped) == 1 and "is it up?" in dropped[0]
    # Said once by us, not once per retry by the OTLP exporter's own logger.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")] == []


def _value(attribute: dict[str, Any]) -> Any:
    value = attribute["value"]
    if value.get("array_value") is not None:
        return [_value({"value": v}) for v in value["array_value"]["values"]]
    return next(v for v in value.values() if v is not None)


def _spans(base: str) -> list[dict[str, Any]]:
    spans, cursor = [], None
    while True:
        url = f"{base}/v1/projects/default/spans/otlpv1?limit=1000"
        if cursor:
            url += f"&cursor={cursor}"
        with urllib.request.urlopen(url) as answer:
            page = json.loads(answer.read())
        spans += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz") as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path(PHOENIX).exists(), reason="Phoenix is not installed (make phoenix)")
def test_phoenix_holds_one_trace_per_query_span_for_span(
    sample_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    served = OfflineConfig(model_aliases={MODEL: "offline/heuristic"})
    with (tmp_path / "phoenix.log").open("wb") as log:
        phoenix = subprocess.Popen(
            [PHOENIX, "serve"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        with OfflineProvider(served) as provider:
            config = tmp_path / "run.yaml"
            config.write_text(
                f"retrieval: {{index_root: '{sample_index.parent}'}}\n"
                f"slice: {{sample: {QUERIES}, seed: 4}}\n"
                f"model: {{name: {MODEL}, litellm_model: openai/{MODEL}, "
                f"api_base: '{provider.base_url}'}}\n"
                "runtime: {max_concurrency: 2}\n"
            )
            wait_for("Phoenix", lambda: _healthy(base), deadline_s=180)
            run_dir = tmp_path / "run"
            done = subprocess.run(
                [sys.executable, "-m", "piserini_ray.cli", "run", "--config", str(config),
                 "--run-dir", str(run_dir)],
                capture_output=True, text=True, timeout=600,
                env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": base},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-3000:]
            assert f"go to {base}/v1/traces" in done.stderr
        records = [orjson.loads(li) for li in (run_dir / "records.jsonl").read_bytes().splitlines()]
        expected = sum(
            1 + len(r["trajectory"]) + sum(len(t["tool_calls"]) for t in r["trajectory"])
            for r in records
        )
        wait_for("every span in Phoenix", lambda: len(_spans(base)) >= expected, deadline_s=60)
        spans = _spans(base)
        assert len(spans) == expected
        assert KEY not in json.dumps(spans)  # no credential in any span
        by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for span in spans:
            span["attrs"] = {a["key"]: _value(a) for a in span["attributes"]}
            by_trace[span["trace_id"]].append(span)
        assert len(by_trace) == len(records)  # one trace per query
        verdicts = {
            v["query_id"]: v
            for v in map(
                orjson.loads,
                next((run_dir / "judgements").glob("*.jsonl")).read_bytes().splitlines(),
            )
        }
        roots = {}
        for trace in by_trace.values():
            (root,) = [s for s in trace if s["parent_span_id"] is None]
            assert root["name"] == "invoke_agent piserini"
            assert all(s["parent_span_id"] == root["span_id"] for s in trace if s is not root)
            roots[root["attrs"]["piserini.query_id"]] = (root, trace)
        assert set(roots) == {r["query_id"] for r in records}
        for record in records:
            root, trace = roots[record["query_id"]]
            attrs = root["attrs"]
            assert attrs["gen_ai.operation.name"] == "invoke_agent"
            assert attrs["piserini.status"] == record["status"]
            assert attrs["gen_ai.usage.input_tokens"] == record["usage"]["input_tokens"]
            assert attrs["gen_ai.usage.output_tokens"] == record["usage"]["output_tokens"]
            verdict = verdicts[record["query_id"]]
            assert attrs["piserini.verdict"] == ("correct" if verdict["correct"] else "wrong")
            chats = sorted(
                (s for s in trace if s["name"] == f"chat {MODEL}"),
                key=lambda s: s["attrs"]["piserini.turn"],
            )
            assert len(chats) == len(record["trajectory"])
            for chat, turn in zip(chats, record["trajectory"], strict=True):
                a = chat["attrs"]
                assert (
                    a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
                )
                assert a["gen_ai.usage.input_tokens"] == turn["usage"]["input_tokens"]
                assert a["gen_ai.usage.output_tokens"] == turn["usage"]["output_tokens"]
                assert a["gen_ai.usage.cache_read.input_tokens"] == turn["usage"]["cached_tokens"]
                reason = turn["finish_reason"]
                assert a.get("gen_ai.response.finish_reasons") == ([reason] if reason else None)
            tools = [s for s in trace if s["name"].startswith("execute_tool ")]
            calls = [c for t in record["trajectory"] for c in t["tool_calls"]]
            assert sorted(s["name"] for s in tools) == sorted(
                f"execute_tool {c['name']}" for c in calls
            )
            shown = sorted(tuple(s["attrs"].get("piserini.docids", [])) for s in tools)
            assert shown == sorted(tuple(c["docids"]) for c in calls)
    finally:
        phoenix.send_signal(signal.SIGTERM)
        try:
            phoenix.wait(60)
        except subprocess.TimeoutExpired:
            phoenix.kill()
            phoenix.wait(30)
