"""The cluster path as documented: `ray start --head`, then `ray job submit --working-dir .` of
`jobs/run_benchmark.py`, `ray job stop` mid-run, and a second submit that resumes.

Everything is real: a Ray head started with the `ray` command (its own temp dir and ports, on
127.0.0.1, token authentication on), the job CLI, a fresh copy of this checkout as the working
dir (as a user's clone would be), the offline provider on loopback. The head is stopped by the
PIDs it started, never `ray stop`.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from piserini_ray.offline import OfflineConfig
from piserini_ray_testkit import EmulatedProvider

pytestmark = pytest.mark.slow  # a Ray job submitted, stopped and resubmitted: a minute and a half

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
QUERIES = 20
JOB = ["python", "jobs/run_benchmark.py", "--config", "configs/job_test.yaml"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _processes_of(marker: str) -> set[int]:
    """PIDs whose command line names `marker` (our head's temp dir) and their descendants
    (workers retitle themselves `ray::...`)."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        if marker.encode() in cmdline:
            found.add(int(entry.name))
    found.discard(os.getpid())
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def _stop_processes(marker: str) -> None:
    pids = _processes_of(marker)
    # A few seconds to exit cleanly, then SIGKILL (some of Ray's helpers ignore SIGTERM).
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(_alive(pid) for pid in pids):
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its reaper is not us


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head started with `ray start --head`: its job server's URL and the environment
    the `ray job` commands (and, through the head, the job) run in."""
    # Ray's socket paths must stay short: its temp dir goes under /tmp, not pytest's tmp_path.
    temp_dir = tempfile.mkdtemp(prefix="prj-", dir="/tmp")
    dashboard = _free_port()
    env = os.environ | {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # `python` is this venv's
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray binds to 127.0.0.1, not the host's IP
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PISERINI_RAY_HOME": str(tmp_path / "home"),
    }
    worker_ports = _free_port()
    workers = range(worker_ports, worker_ports + 101)

    def outside_workers(port: int) -> int:
        # Ray refuses a component port inside the workers' range ("used by other components").
        while port in workers:
            port = _free_port()
        return port

    ports = {
        name: outside_workers(_free_port() if port is None else port)
        for name, port in {
            "port": None,
            "dashboard-port": dashboard,
            "ray-client-server-port": None,
            "dashboard-agent-listen-port": None,
            "dashboard-agent-grpc-port": None,
            "metrics-export-port": None,
            "runtime-env-agent-port": None,
            "node-manager-port": None,
            "object-manager-port": None,
        }.items()
    }
    dashboard = ports["dashboard-port"]
    start = [
        str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1", "--include-dashboard=true", "--num-cpus=2",
        f"--object-store-memory={256 << 20}", f"--temp-dir={temp_dir}",
        f"--min-worker-port={worker_ports}", f"--max-worker-port={worker_ports + 100}",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]  # fmt: skip
    try:
        started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stderr[-3000:]
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        _stop_processes(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _checkout(dest: Path) -> Path:
    """A copy of this checkout's files as a clone has them (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _ray_job(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ray"), "job", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def _records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_a_submitted_job_stopped_mid_run_resumes_on_the_next_submit(
    ray_head: tuple[str, dict[str, str]], tmp_path: Path, sample_index: Path, index_root: Path
) -> None:
    address, env = ray_head
    # The sample's offline agent under a hosted model's name, behind a provider this test
    # holds: past 30 calls every call waits, so the job is stopped mid-run, surely.
    served = OfflineConfig(
        prefix_caching=False, model_aliases={"gpt-5.4-mini": "offline/heuristic"}
    )
    with EmulatedProvider(served) as provider:
        _stopped_then_resumed(address, env, tmp_path, index_root, provider)


def _stopped_then_resumed(
    address: str, env: dict[str, str], tmp_path: Path, index_root: Path, provider: EmulatedProvider
) -> None:
    from ray._private.runtime_env.packaging import get_uri_for_directory
    from ray.job_submission import JobStatus, JobSubmissionClient

    checkout = _checkout(tmp_path / "clone")
    config = checkout / "configs" / "job_test.yaml"
    config.write_text(
        "# The sample, its model held by the test so that the job can be stopped mid-run.\n"
        f"slice: {{sample: {QUERIES}}}\n"
        f"retrieval: {{index_root: {index_root}}}\n"
        "model: {name: gpt-5.4-mini, litellm_model: openai/gpt-5.4-mini, "
        f"api_base: '{provider.base_url}'}}\n"
        "runtime: {max_concurrency: 2}\n"
    )
    client = JobSubmissionClient(
        address, headers={"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"}
    )
    # The model's key reaches the job as a variable of its runtime env (the offline provider
    # takes any key).
    keyed = '{"env_vars": {"OPENAI_API_KEY": "sk-job-test"}}'
    submit = ["submit", "--address", address, "--working-dir", ".", "--runtime-env-json", keyed]
    provider.hold(after=30)
    first = _ray_job(env, checkout, *submit, "--submission-id", "job-1", "--no-wait", "--", *JOB)
    assert first.returncode == 0, first.stderr[-3000:]

    # The job prints where its run lives: an absolute path under the runs root, outside the
    # job's copy of the working dir.
    found: list[str] = []

    def run_dir_printed() -> bool:
        found[:] = re.findall(r"\] run (/\S+): ", client.get_job_logs("job-1"))
        assert client.get_job_status("job-1") in (JobStatus.PENDING, JobStatus.RUNNING)
        return bool(found)

    wait_for("the job to print its run directory", run_dir_printed)
    run_dir = Path(found[0])
    assert run_dir.parent == tmp_path / "home" / "runs"
    records = run_dir / "records.jsonl"
    # Both queries in flight wait on the provider: every query that could end is recorded.
    assert provider.wait_held(2), "the job never had its queries in flight"

    stopped = _ray_job(env, checkout, "stop", "--address", address, "job-1")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    wait_for("the job to stop", lambda: client.get_job_status("job-1") == JobStatus.STOPPED)
    provider.release()
    logs = client.get_job_logs("job-1")
    assert "SIGTERM received" not in logs and "Traceback" not in logs, logs[-3000:]
    kept = records.read_bytes()
    done_before = len(_records(records))
    assert 1 <= done_before < QUERIES, "the job finished before it could be stopped"

    # A comment edited in the config gives Ray a new package, and so a fresh working dir.
    package = get_uri_for_directory(str(checkout), include_gitignore=True)
    config.write_text("# edited before the second submit\n" + config.read_text())
    assert get_uri_for_directory(str(checkout), include_gitignore=True) != package

    second = _ray_job(env, checkout, *submit, "--submission-id", "job-2", "--", *JOB)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    out = second.stdout + second.stderr
    assert (
        f"run {run_dir}: {QUERIES} queries, {done_before} already recorded, "
        f"{QUERIES - done_before} to run" in out
    ), out[-3000:]
    assert "Job 'job-2' succeeded" in out
    final = records.read_bytes()
    assert final.startswith(kept)  # what the stopped job recorded stays as it was
    ids = [r["query_id"] for r in _records(records)]
    assert len(ids) == QUERIES and len(set(ids)) == QUERIES  # every query once, none twice
    for name in ("summary.json", "report.md", "report.html"):
        assert (run_dir / name).is_file()
    print(out[-2500:])  # the closing note quotes it (`pytest -s`)


def test_the_job_package_leaves_out_runs_data_and_the_venv(tmp_path: Path) -> None:
    """`ray job submit --working-dir .` zips the checkout: run directories, benchmark data and
    the virtualenv must neither ride along (BrowseComp-Plus is gigabytes) nor change the
    package (Ray does not apply .gitignore's `runs/` to the directory itself; .rayignore
    does)."""
    from ray._private.runtime_env.packaging import get_uri_for_directory

    checkout = _checkout(tmp_path / "clone")
    package = get_uri_for_directory(str(checkout), include_gitignore=True)
    for name in (
        "runs/sample-x/records.jsonl",
        "data/browsecomp-plus/corpus.parquet",
        ".venv/bin/python",
        "piserini_ray/__pycache__/cli.cpython-311.pyc",
        ".mypy_cache/3.11/x.json",
        "bench/out/table.txt",
    ):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("x")
    assert get_uri_for_directory(str(checkout), include_gitignore=True) == package
    (checkout / "piserini_ray" / "data" / "sample" / "new.txt").write_text("x")
    assert get_uri_for_directory(str(checkout), include_gitignore=True) != package  # code counts
