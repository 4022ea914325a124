"""Failures the runtime must survive: a node lost mid-run, and the driver killed with SIGKILL.

Each test brings its own Ray: a simulated multi-node cluster in this process, or a driver
subprocess that starts (and, killed, leaves behind) its own local instance, which the test ends
by process group. Never `ray stop`.

The runs' model is the sample's offline agent behind a provider the test holds
(`EmulatedProvider.hold`): past a set number of calls, every call waits unanswered, so a process
is killed while queries are surely in flight and before the run can end, whatever the
machine's speed; the test waits on that event (`wait_held`), never on a clock, then releases
the rest.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from piserini_ray.config import RunConfig, load_config
from piserini_ray.offline import OfflineConfig
from piserini_ray.pipeline import run_on_ray
from piserini_ray_testkit import EmulatedProvider

pytestmark = pytest.mark.slow  # Ray instances of their own, killed mid-run

#: The runs' model: the sample's offline agent under a hosted model's name, served by the
#: test's provider (no prefix caching: a resumed run is billed as a clean one).
MODEL = "gpt-5.4-mini"
#: Calls answered before the provider holds the rest: the model checks and at least one whole
#: query (a query takes 7 to 12 calls, two or three run at once), never the whole run.
ANSWERED = 30


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatedProvider]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-faults")
    served = OfflineConfig(prefix_caching=False, model_aliases={MODEL: "offline/heuristic"})
    with EmulatedProvider(served) as running:
        yield running


def _model(provider: EmulatedProvider) -> dict[str, str]:
    return {
        "model.name": MODEL,
        "model.litellm_model": f"openai/{MODEL}",
        "model.api_base": provider.base_url,
    }


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "records.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.endswith(b"}")]


def _fault_config(
    provider: EmulatedProvider, index_root: Path, queries: int, seed: int, **more: object
) -> RunConfig:
    """The sample's `queries` (seeded), the model behind the test's `provider`."""
    return load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "slice.sample": queries,
            "slice.seed": seed,
            **_model(provider),
            **more,
        },
    )


def test_a_worker_node_lost_mid_run(
    sample_index: Path, index_root: Path, tmp_path: Path, provider: EmulatedProvider
) -> None:
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
            provider,
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
            # Both replicas' two queries each wait on the provider: the node goes mid-query.
            assert provider.wait_held(4), "the run never had its four queries in flight"
            cluster.remove_node(workers[0])
            provider.release()

        provider.hold(after=ANSWERED)
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
    rows = [line.split("|")[2:] for line in stdout.splitlines() if f"| {MODEL} |" in line]
    return lines + ["|".join(row) for row in rows]


def _run_config(
    provider: EmulatedProvider, sample_index: Path, tmp_path: Path, queries: int, seed: int
) -> tuple[Path, Path]:
    """A run of the sample's `queries` behind the test's `provider`, and its run directory."""
    config = tmp_path / "run.yaml"
    config.write_text(
        f"retrieval: {{index_root: '{sample_index.parent}'}}\n"
        f"slice: {{sample: {queries}, seed: {seed}}}\n"
        f"model: {{name: {MODEL}, litellm_model: openai/{MODEL}, "
        f"api_base: '{provider.base_url}'}}\n"
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


def _held_mid_run(provider: EmulatedProvider, driver: subprocess.Popen, in_flight: int) -> None:
    """Until `in_flight` queries wait on the provider: every query that could end has been
    recorded (a replica gets its next query only once the driver wrote the last one's
    record), and the run cannot end."""
    assert provider.wait_held(in_flight), "the run never had its queries in flight"
    assert driver.poll() is None, "the driver ended before it was stopped"


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


def test_driver_killed_then_resumed(
    sample_index: Path, tmp_path: Path, provider: EmulatedProvider
) -> None:
    config, run_dir = _run_config(provider, sample_index, tmp_path, 12, 5)
    provider.hold(after=ANSWERED)
    driver = _driver(config, run_dir, subprocess.DEVNULL)
    try:
        _held_mid_run(provider, driver, 2)
        recorded = len(_records(run_dir))
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # the Ray it started, orphaned by the kill
        provider.release()
    assert 1 <= recorded < 12 and len(_records(run_dir)) == recorded
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
    sample_index: Path, tmp_path: Path, provider: EmulatedProvider, stop: signal.Signals
) -> None:
    """Ctrl-C, and SIGTERM (what `ray job stop` and schedulers send), stop a run cleanly: the
    same message, no crash trace, and resume runs exactly the rest."""
    config, run_dir = _run_config(provider, sample_index, tmp_path, 8, 4)
    provider.hold(after=ANSWERED)
    driver = _driver(config, run_dir, subprocess.PIPE)
    try:
        _held_mid_run(provider, driver, 2)
        driver.send_signal(stop)
        _, stderr = driver.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        provider.release()
    assert driver.returncode == 130, stderr[-2000:]
    # Two calls held at the provider; the driver's count of queries in flight at the signal
    # was one, not two, once under the full suite's load: either is a clean stop, and resume
    # below checks that exactly the queries without a record run again.
    assert re.search(r"interrupted: [12] queries in flight were abandoned", stderr), stderr[-2000:]
    assert "they run again, nothing else does" in stderr
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr
    raw = (run_dir / "records.jsonl").read_bytes()
    assert raw.endswith(b"\n")  # nothing half-written
    recorded = len(raw.splitlines())
    assert 1 <= recorded < 8
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


def _kill_held(
    provider: EmulatedProvider, in_flight: int, pid_of: Callable[[], int], killed: list[int]
) -> None:
    """Once `in_flight` queries wait on the provider, SIGKILL the process `pid_of()` names."""
    assert provider.wait_held(in_flight), "the run never had its queries in flight"
    pid = pid_of()
    os.kill(pid, signal.SIGKILL)
    killed.append(pid)


def test_a_replica_killed_with_sigkill_costs_no_query(
    index_root: Path, tmp_path: Path, provider: EmulatedProvider
) -> None:
    import ray

    _in_process_ray()
    run_dir = tmp_path / "run"
    config = _fault_config(
        provider,
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

    def kill_then_release() -> None:
        try:  # the replica's three queries wait on the provider: it dies mid-query
            _kill_held(provider, 3, replica_pid, killed)
        finally:
            provider.release()

    provider.hold(after=ANSWERED)
    killer = threading.Thread(target=kill_then_release, daemon=True)
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
    index_root: Path, tmp_path: Path, provider: EmulatedProvider
) -> None:
    import ray

    from piserini_ray.engines.ray.driver_services import services_name
    from piserini_ray.llm.limiter import quota_key

    _in_process_ray()
    run_dir = tmp_path / "run"
    rate_limit = {"requests_per_minute": 1000, "window_seconds": 1.0, "window_margin": 0.1}
    config = _fault_config(
        provider,
        index_root,
        10,
        12,
        **{"model.rate_limit": rate_limit, "runtime.max_concurrency": 3},
    )
    # The limiters live in the job's actor on the driver's node (`driver_services.py`).
    name, key = services_name(), quota_key(config.model, config.offline)

    def limiter_pid() -> int:
        return ray.get(ray.get_actor(name).stats.remote(key)).pid

    stats: list[object] = []

    def kill_then_look() -> None:
        killed: list[int] = []
        try:  # three queries wait on the provider, their slots granted by the limiter
            _kill_held(provider, 3, limiter_pid, killed)

            def back() -> bool:  # Ray has brought it back: another process answers
                with contextlib.suppress(Exception):
                    found = ray.get(ray.get_actor(name).stats.remote(key), timeout=5)
                    if found.pid != killed[0]:
                        stats.append(found)
                        return True
                return False

            wait_for("the limiter restarted by Ray", back, deadline_s=120)
        finally:
            provider.release()

    provider.hold(after=ANSWERED)
    looker = threading.Thread(target=kill_then_look, daemon=True)
    looker.start()
    try:
        (summary,) = run_on_ray([(config, run_dir)], lambda _m: None)
        looker.join(timeout=120)
        after = ray.get(ray.get_actor(name).stats.remote(key), timeout=30)
    finally:
        ray.shutdown()
    ids = [r["query_id"] for r in _records(run_dir)]
    assert len(ids) == len(set(ids)) == 10 and summary.statuses == {"completed": 10}
    assert stats and stats[0].restarted  # restarted, and it held one window before admitting
    # The model's limiter was added again by the first call that missed it, and granted.
    assert after.restarted and after.granted > 0 and after.pid == stats[0].pid
