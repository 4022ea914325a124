"""Failures the runtime must survive: a node lost mid-run, and the driver killed with SIGKILL.

Each test brings its own Ray: a simulated multi-node cluster in this process, or a driver
subprocess that starts (and, killed, leaves behind) its own local instance, which the test ends
by process group. Never `ray stop`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from piserini_ray.config import RunConfig, load_config
from piserini_ray.pipeline import run_on_ray

pytestmark = pytest.mark.slow  # Ray instances of their own, killed mid-run


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "records.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.endswith(b"}")]


def _fault_config(index_root: Path, queries: int, seed: int, **more: object) -> RunConfig:
    """The sample's `queries` (seeded), each model call 0.15 s: runs long enough to hurt."""
    return load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "slice.sample": queries,
            "slice.seed": seed,
            "offline.latency": {"kind": "fixed", "seconds": 0.15},
            **more,
        },
    )


def test_a_worker_node_lost_mid_run(sample_index: Path, index_root: Path, tmp_path: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": 80 * 2**20,
        },
    )
    workers = [cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20) for _ in range(2)]
    cluster.wait_for_nodes()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        run_dir = tmp_path / "run"
        config = _fault_config(
            index_root,
            10,
            7,
            **{
                "runtime.address": cluster.address,
                "runtime.replicas": 2,
                "runtime.cpus_per_replica": 0.5,
                "runtime.max_concurrency": 2,
                "runtime.placement": "spread",
            },
        )
        logs: list[str] = []

        def lose_a_node() -> None:
            deadline = time.monotonic() + 300
            while len(_records(run_dir)) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            cluster.remove_node(workers[0])

        killer = threading.Thread(target=lose_a_node, daemon=True)
        killer.start()
        (summary,) = run_on_ray([(config, run_dir)], logs.append)
        killer.join(timeout=60)
        assert any("2 searcher replica(s) ready on 2 node(s)" in m for m in logs)
        ids = [r["query_id"] for r in _records(run_dir)]
        assert len(ids) == len(set(ids)) == 10  # every query recorded, once
        errors = [r["error"] for r in _records(run_dir) if r["status"] != "completed"]
        assert summary.statuses == {"completed": 10}, errors
        assert any("replica lost" in m for m in logs)  # some queries had to run again
    finally:
        ray.shutdown()
        cluster.shutdown()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "piserini_ray.cli", *args]


def _summary_lines(stdout: str) -> list[str]:
    """Tool calls per query, and the report row without its run directory (accuracy, recalls,
    calibration, cost)."""
    lines = [line for line in stdout.splitlines() if line.startswith("tool calls")]
    rows = [line.split("|")[2:] for line in stdout.splitlines() if "| offline/heuristic |" in line]
    return lines + ["|".join(row) for row in rows]


def _slow_run(sample_index: Path, tmp_path: Path, queries: int, seed: int) -> tuple[Path, Path]:
    """A config whose run lasts long enough to interrupt, and its run directory."""
    config = tmp_path / "slow.yaml"
    config.write_text(
        f"retrieval: {{index_root: '{sample_index.parent}'}}\n"
        f"slice: {{sample: {queries}, seed: {seed}}}\n"
        "offline: {latency: {kind: fixed, seconds: 0.2}}\n"
        "runtime: {max_concurrency: 2}\n"
    )
    return config, tmp_path / "run"


def _driver(config: Path, run_dir: Path, stderr: int) -> subprocess.Popen:
    return subprocess.Popen(
        _cli("run", "--config", str(config), "--run-dir", str(run_dir)),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def _resume(run_dir: Path, recorded: int, total: int) -> subprocess.CompletedProcess[str]:
    """`piserini-ray resume`, checked to run exactly the queries without a record."""
    resumed = subprocess.run(
        _cli("resume", str(run_dir)),
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{recorded} already recorded, {total - recorded} to run" in resumed.stderr
    return resumed


def _wait_for_records(run_dir: Path, count: int, driver: subprocess.Popen | None = None) -> None:
    """Until the run holds `count` records (5 minutes at most); the driver must still run."""
    deadline = time.monotonic() + 300
    while len(_records(run_dir)) < count and time.monotonic() < deadline:
        assert driver is None or driver.poll() is None, "the driver ended before it was stopped"
        time.sleep(0.1)


def test_driver_killed_then_resumed(sample_index: Path, tmp_path: Path) -> None:
    config, run_dir = _slow_run(sample_index, tmp_path, 12, 5)
    driver = _driver(config, run_dir, subprocess.DEVNULL)
    try:
        _wait_for_records(run_dir, 3, driver)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # the Ray it started, orphaned by the kill
    recorded = len(_records(run_dir))
    assert 3 <= recorded < 12
    resumed = _resume(run_dir, recorded, 12)
    records = _records(run_dir)
    ids = [r["query_id"] for r in records]
    assert len(ids) == len(set(ids)) == 12
    # The same summary a clean run gives: the offline model is deterministic.
    clean = tmp_path / "clean"
    out = subprocess.run(
        _cli("run", "--config", str(config), "--run-dir", str(clean), "--engine", "local"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]

    def key(r: dict) -> tuple:
        return (
            r["query_id"],
            r["status"],
            r["exact_answer"],
            r["tool_call_counts"],
            r["usage"]["output_tokens"],
        )

    assert sorted(map(key, records)) == sorted(map(key, _records(clean)))
    assert _summary_lines(resumed.stdout) == _summary_lines(out.stdout) != []


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_cleanly_and_resume_finishes(
    sample_index: Path, tmp_path: Path, stop: signal.Signals
) -> None:
    """Ctrl-C, and SIGTERM (what `ray job stop` and schedulers send), stop a run cleanly: the
    same message, no crash trace, and resume runs exactly the rest."""
    config, run_dir = _slow_run(sample_index, tmp_path, 8, 4)
    driver = _driver(config, run_dir, subprocess.PIPE)
    try:
        _wait_for_records(run_dir, 2)
        driver.send_signal(stop)
        _, stderr = driver.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 130, stderr[-2000:]
    assert "interrupted:" in stderr and "they run again, nothing else does" in stderr
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr
    raw = (run_dir / "records.jsonl").read_bytes()
    assert raw.endswith(b"\n")  # nothing half-written
    recorded = len(raw.splitlines())
    _resume(run_dir, recorded, 8)
    ids = [r["query_id"] for r in _records(run_dir)]
    assert len(ids) == len(set(ids)) == 8


# ---------------------------------------------------------------- processes killed mid-run


def _in_process_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False
    )


def _kill_when(run_dir: Path, records: int, pid_of: Callable[[], int], killed: list[int]) -> None:
    """Once the run holds `records` records, SIGKILL the process `pid_of()` names."""
    _wait_for_records(run_dir, records)
    pid = pid_of()
    os.kill(pid, signal.SIGKILL)
    killed.append(pid)


def test_a_replica_killed_with_sigkill_costs_no_query(index_root: Path, tmp_path: Path) -> None:
    import ray

    _in_process_ray()
    run_dir = tmp_path / "run"
    config = _fault_config(
        index_root,
        12,
        11,
        **{"runtime.replicas": 1, "runtime.max_restarts": 3, "runtime.max_concurrency": 3},
    )
    logs: list[str] = []
    ready = threading.Event()

    def log(message: str) -> None:
        logs.append(message)
        if "searcher replica(s) ready" in message:
            ready.set()

    def replica_pid() -> int:
        assert ready.wait(300)
        line = next(m for m in logs if "searcher replica(s) ready" in m)
        return int(line.rsplit("pids ", 1)[1].rstrip(")"))

    killed: list[int] = []
    killer = threading.Thread(
        target=_kill_when, args=(run_dir, 2, replica_pid, killed), daemon=True
    )
    killer.start()
    try:
        (summary,) = run_on_ray([(config, run_dir)], log)
    finally:
        ray.shutdown()
    killer.join(timeout=60)
    assert killed, "the replica was never killed"
    ids = [r["query_id"] for r in _records(run_dir)]
    assert len(ids) == len(set(ids)) == 12  # every query recorded, once
    assert summary.statuses == {"completed": 12}, [r["error"] for r in _records(run_dir)]
    assert any("replica lost" in m for m in logs)  # the queries in flight ran again
    back = [m for m in logs if m.startswith("replica 0 is back (pid ")]
    assert back and f"(pid {killed[0]})" not in back[0]  # a new process took over
    assert not any("gone for good" in m for m in logs)


def test_a_limiter_killed_mid_run_comes_back_holding_its_window(
    index_root: Path, tmp_path: Path
) -> None:
    import ray

    from piserini_ray.llm.limiter import quota_key
    from piserini_ray.runtime.limiter_actor import job_limiter_prefix

    _in_process_ray()
    run_dir = tmp_path / "run"
    rate_limit = {"requests_per_minute": 1000, "window_seconds": 1.0, "window_margin": 0.1}
    config = _fault_config(
        index_root,
        10,
        12,
        **{"model.rate_limit": rate_limit, "runtime.max_concurrency": 3},
    )
    name = job_limiter_prefix() + quota_key(config.model, config.offline)

    def limiter_pid() -> int:
        return ray.get(ray.get_actor(name).stats.remote()).pid

    stats: list[object] = []

    def kill_then_look() -> None:
        killed: list[int] = []
        _kill_when(run_dir, 3, limiter_pid, killed)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until Ray has brought it back
            with contextlib.suppress(Exception):
                found = ray.get(ray.get_actor(name).stats.remote(), timeout=5)
                if found.pid != killed[0]:
                    stats.append(found)
                    return
            time.sleep(0.2)

    looker = threading.Thread(target=kill_then_look, daemon=True)
    looker.start()
    try:
        (summary,) = run_on_ray([(config, run_dir)], lambda _m: None)
        looker.join(timeout=120)
    finally:
        ray.shutdown()
    ids = [r["query_id"] for r in _records(run_dir)]
    assert len(ids) == len(set(ids)) == 10 and summary.statuses == {"completed": 10}
    assert stats and stats[0].restarted  # restarted, and it held one window before admitting
