"""Issue 30's whole path on a real cluster (two hosts, tests/hosts.py; token auth on, as on
every Ray we start).

- A canary key, in a variable with an innocuous name (`RUN_LABEL_B`, named by
  `model.api_key_env`), goes to a provider on host 1's loopback that quotes the key it was sent
  in every error (tests/llm/echo_provider.py), from both hosts: at the batch tier (the run's
  batcher actor sends the batches; the one-word checks cross host 2's relay) and on the
  refused-key path (each node's check refused, with the key in the error; on Ray the driver
  checks no agent model itself: its replicas do, from every node). Then the canary, raw and
  as base64, URL-encoded, JSON-escaped and hex, is searched in
  the run directory, the ledgers, both hosts' Ray temp folders and logs (host 2's private /tmp,
  /dev/shm and HOME too), spilled objects and the command's output: it is nowhere.
  Spilling is forced: each host's object store is small, the queries are long (a replica's job
  is over Ray's 100 KiB inline limit, so it lives in the object store), and while a batch is
  being sent the driver fills its node's store, so that what is pinned there is written to
  disk; the spilled files are searched at that moment (Ray deletes them once freed).
- A process without the cluster's token cannot join it, from either host (no token at all, or
  a wrong one; the same process with the token joins), while a run is going; the run completes.
- A config whose `model.extra` names another endpoint is refused (exit 2) on the cluster path
  too, with no request to either endpoint.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest
from helpers import marked_results, wait_for
from hosts import VENV_BIN, TwoHosts, require_two_hosts

pytestmark = pytest.mark.slow

#: The key's variable: a name no secret-name rule would catch.
KEY_VAR = "RUN_LABEL_B"
#: In every long query: how a spilled file holding a replica's job is recognised.
MARKER = f"longquery{secrets.token_hex(6)}"
LLM_TESTS = Path(__file__).resolve().parents[2] / "llm"  # echo_provider.py
SAMPLE = Path(__file__).resolve().parents[3] / "piserini_ray" / "data" / "sample"
#: Each host's object store (Ray's minimum is 75 MiB) and what the driver puts to overflow its own.
STORE_MB, FILLERS, FILLER_MB = 80, 14, 8


def canary() -> str:
    """A fresh key; `+` and `/` make its URL-encoded forms differ from it."""
    return f"sk-canary.{secrets.token_hex(12)}+{secrets.token_hex(8)}/{secrets.token_hex(6)}"


def forms(key: str) -> dict[str, bytes]:
    """The key as a file could hold it: raw, JSON-escaped, URL-encoded, hex, and base64
    (standard and URL-safe) at each of the three alignments it can take inside a longer
    encoded text (the characters that mix in the neighbouring bytes are left out)."""
    import base64
    from urllib.parse import quote, quote_plus

    raw = key.encode()
    found = {
        "raw": raw,
        "json": key.replace("/", "\\/").encode(),
        "url": quote(key, safe="").encode(),
        "url+": quote_plus(key).encode(),
        "hex": raw.hex().encode(),
    }
    for shift in range(3):
        for name, encode in (("b64", base64.b64encode), ("b64url", base64.urlsafe_b64encode)):
            text = encode(b"\0" * shift + raw)
            found[f"{name}{shift}"] = text[(shift * 8 + 5) // 6 : (shift + len(raw)) * 8 // 6]
    return found


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    """Every regular file under `root` that holds any of `needles`."""
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
        except OSError:  # sockets, vanished session files
            continue
        if any(needle in data for needle in needles):
            found.append(str(path))
    return found


HELPERS = inspect.getsource(forms) + "\n\n" + inspect.getsource(files_holding)

#: The driver, in host 1: writes the run's config, starts the endpoint the mode needs, runs
#: the CLI in-process and reports what it saw (never the key).
DRIVER = (
    "import asyncio, json, os, sys, threading, time\nfrom pathlib import Path\n\n"
    + HELPERS
    + r'''

mode, address, root, llm_tests, name = sys.argv[1:6]
marker, fillers, filler_mb = sys.argv[6], int(sys.argv[7]), int(sys.argv[8])
root = Path(root)
data = root / "data"
sys.path.insert(0, llm_tests)
from echo_provider import CHECK_PROMPT, EchoProvider
from piserini_ray.cli import main

key = os.environ["RUN_LABEL_B"]
run_dir, config_file = data / f"run-{name}", data / f"{name}.yaml"
out = {}
config = {
    "runtime": {"address": address, "replicas": 2, "placement": "spread",
                "cpus_per_replica": 1, "batch": {"gather_seconds": 0.5, "poll_seconds": 0.5}},
    "retrieval": {"index_root": str(data / "indexes")},
    "judge": {"model": {"name": "offline/exact-match-judge"}},
    "pricing": {"allow_litellm_prices": True},
    "retry": {"max_attempts": 2, "backoff_base": 0.01, "backoff_cap": 0.01},
}
bench = data / "bench"


def model(base, tier="standard", name="gpt-5", **more):
    return {"name": name, "litellm_model": f"openai/{name}", "api_base": base,
            "api_key_env": "RUN_LABEL_B", "service_tier": tier, "call_timeout": 900, **more}


def spill_and_search():
    """Overflow this node's object store, then search what was spilled (and the rest)."""
    import ray

    held = [ray.put(b"\0" * (filler_mb << 20)) for _ in range(fillers)]
    spilled = [p for p in root.rglob("*") if "ray_spilled_objects" in str(p) and p.is_file()]
    seen = {
        "spilled": [str(p) for p in spilled],
        "with_job": [str(p) for p in spilled
                     if marker.encode() in (b := p.read_bytes()) and b"QueryJob" in b],
        "with_key": files_holding(root, list(forms(key).values())),
    }
    del held
    return seen


class Canary(EchoProvider):
    """Answers the checks; `refused`: refuses every check (the nodes'), quoting the key;
    `batch`: on the first request of a batch, spills and searches."""

    def __init__(self):
        super().__init__()
        self.lock, self.checks, self.paused = threading.Lock(), 0, None

    def reply(self, path, headers, body):
        with self.lock:
            if CHECK_PROMPT in str(body):
                self.checks += 1
                self.answer_check = mode != "refused"
            elif mode == "batch" and self.paused is None:
                self.paused = spill_and_search()
        return super().reply(path, headers, body)


if mode in ("batch", "refused"):
    with Canary() as provider:
        config |= {
            "model": model(provider.base_url, "batch" if mode == "batch" else "standard"),
            "benchmark": {"source": "jsonl", "name": "canary",
                          "queries": str(bench / "long.jsonl"),
                          "corpus": str(bench / "corpus.jsonl")},
            "agent": {"termination": "iterations", "max_iterations": 4},
        }
        config_file.write_text(json.dumps(config))
        out["status"] = main(["run", "--config", str(config_file), "--run-dir", str(run_dir)])
        out["carried"] = sum(key in str(h) for _m, _p, h in provider.requests)
        out["checks"] = provider.checks
        out["paths"] = sorted({p for _m, p, _h in provider.requests})
        out["paused"] = provider.paused
elif mode == "extra":
    with EchoProvider() as own, EchoProvider() as other:
        config["model"] = model(own.base_url, extra={"api_base": other.base_url})
        config_file.write_text(json.dumps(config))
        out["status"] = main(["run", "--config", str(config_file), "--run-dir", str(run_dir)])
        out["requests"] = [len(own.requests), len(other.requests)]
elif mode == "gated":
    from piserini_ray.offline import OfflineConfig, OfflineProvider
    from piserini_ray.offline.hooks import Interceptor, Ticket

    asked, gate = data / f"{name}.asked", data / f"{name}.open"

    class GatedTicket(Ticket):
        async def delay(self, record):
            """A query's first request waits for the test to open the gate (the checks do
            not): the run is going, with its replicas up, until then."""
            if CHECK_PROMPT not in json.dumps(record.messages):
                asked.touch()
                while not gate.exists():
                    await asyncio.sleep(0.1)

    class Gated(Interceptor):
        def ticket(self, parsed, record):
            return GatedTicket()

    served = OfflineConfig(require_key=True, model_aliases={"gpt-5.4-mini": "offline/heuristic"})
    with OfflineProvider(served, interceptor=Gated()) as provider:
        config |= {
            "model": model(provider.base_url, name="gpt-5.4-mini"),
            "benchmark": {"source": "jsonl", "name": "canary",
                          "queries": str(bench / "queries.jsonl"),
                          "corpus": str(bench / "corpus.jsonl")},
            "slice": {"sample": 4, "seed": 1},
            "agent": {"budget_seconds": 3600},
        }
        config_file.write_text(json.dumps(config))
        out["status"] = main(["run", "--config", str(config_file), "--run-dir", str(run_dir)])
records = run_dir / "records.jsonl"
rows = [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
out["statuses"] = sorted(r["status"] for r in rows)
print("RESULT " + json.dumps(out))
'''
)

#: Run inside host 2's mount namespace: which files under the given folders hold a needle
#: (hex, one a line, on stdin: never on a command line).
SCAN = (
    "import json, sys\nfrom pathlib import Path\n\n"
    + HELPERS
    + r"""

needles = [bytes.fromhex(h) for h in sys.stdin.read().split()]
print(json.dumps([f for root in sys.argv[1:] for f in files_holding(Path(root), needles)]))
"""
)

#: A client that tries to join the cluster (from host 2: as that node, `_node_ip_address`).
JOIN = r"""
import sys
import ray
own = {"_node_ip_address": sys.argv[2]} if len(sys.argv) > 2 else {}
try:
    ray.init(address=sys.argv[1], log_to_driver=False, **own)
    print("JOINED", ray.cluster_resources().get("CPU"))
except Exception as error:
    print("REFUSED", type(error).__name__, str(error)[:500])
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[TwoHosts]:
    require_two_hosts()
    # A checkout on PYTHONPATH (a clone of the commit to test) is what host 2 imports too.
    extra = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    hosts = TwoHosts(object_store_mb=STORE_MB, host2_env=extra)
    try:
        hosts.start()
        _benchmark(hosts.data / "bench")
        hosts.wait_for_nodes(2)
        yield hosts
    finally:
        hosts.close()


def _benchmark(folder: Path) -> None:
    """The sample's corpus and queries, and four long queries (~200 KB each: a replica's job
    for one is well over Ray's 100 KiB inline limit, so it goes through the object store)."""
    folder.mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (folder / name).write_bytes((SAMPLE / name).read_bytes())
    words = ["river", "capital", "founded", "author", "museum", "border", "league", "opera"]
    text = " ".join(words[(i * 7) % len(words)] for i in range(28_000))
    rows = [
        {"query_id": f"long-{n}", "query": f"{MARKER} {n}: {text}", "answer": "none"}
        for n in range(4)
    ]
    (folder / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _drive(hosts: TwoHosts, mode: str, key: str, name: str) -> tuple[dict, str]:
    done = hosts.python(*_driver_args(hosts, mode, name), env={KEY_VAR: key})
    return _result(done.stdout, done.stderr, hosts)


def _driver_args(hosts: TwoHosts, mode: str, name: str) -> list[str]:
    return [DRIVER, mode, hosts.head_address, str(hosts.root), str(LLM_TESTS), name, MARKER,
            str(FILLERS), str(FILLER_MB)]  # fmt: skip


def _result(stdout: str, stderr: str, hosts: TwoHosts) -> tuple[dict, str]:
    lines = marked_results(stdout)
    assert lines, stdout[-3000:] + stderr[-6000:] + "\n" + hosts.logs_tail()
    return json.loads(lines[-1]), stderr + stdout


def _found_anywhere(hosts: TwoHosts, key: str, output: str) -> dict[str, list[str]]:
    """Where any form of `key` is: files under the kit's folder (the run directory and
    ledgers, both hosts' Ray temp folders, logs and spilled objects, both PISERINI_RAY_HOMEs),
    host 2's own /tmp, /dev/shm, HOME and PISERINI_RAY_HOME (seen from inside its mount
    namespace), and the command's output."""
    needles = forms(key)
    inside = subprocess.run(
        ["nsenter", "-t", str(hosts.pids["host2"]), "-m", "--", sys.executable, "-c", SCAN,
         "/tmp", "/dev/shm", str(hosts.host2_home), str(hosts.piserini_home[1])],
        input="\n".join(n.hex() for n in needles.values()), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert inside.returncode == 0, inside.stderr[-3000:]
    return {
        "files": files_holding(hosts.root, list(needles.values())),
        "host 2 inside": json.loads(inside.stdout),
        "output": [name for name, form in needles.items() if form.decode() in output],
    }


def test_a_key_echoed_at_the_batch_tier_is_nowhere_spilled_objects_included(
    cluster: TwoHosts,
) -> None:
    key = canary()
    seen, output = _drive(cluster, "batch", key, "batch")
    # The test has teeth: the key went out (the checks from both nodes, the batches) and came
    # back in the errors, the batcher's requests reached the provider, the records hold the
    # scrubbed echo, and the store overflowed while the replicas' jobs were pinned in it.
    assert seen["carried"] >= 3 and seen["checks"] >= 2, output[-6000:]
    assert any("/files" in p or "/batches" in p for p in seen["paths"]), seen["paths"]
    assert seen["statuses"] and set(seen["statuses"]) == {"failed"}, output[-6000:]
    run_dir = cluster.data / "run-batch"
    assert "Authorization: Bearer ***" in (run_dir / "records.jsonl").read_text()
    paused = seen["paused"]
    assert paused is not None and paused["spilled"], (paused, output[-4000:])
    assert paused["with_job"], paused  # a replica's job for a long query was on disk
    # Nowhere: not while spilled, not after.
    assert paused["with_key"] == []
    assert _found_anywhere(cluster, key, output) == {"files": [], "host 2 inside": [], "output": []}


def test_a_key_echoed_by_the_nodes_refused_checks_is_nowhere(cluster: TwoHosts) -> None:
    key = canary()
    seen, output = _drive(cluster, "refused", key, "refused")
    assert seen["status"] == 2, output[-6000:]
    assert seen["statuses"] == []  # a configuration failure is never a query failure
    # Each node's check was refused, quoting the key.
    assert seen["checks"] >= 2 and seen["carried"] >= 2, output[-6000:]
    for host in (cluster.host1, cluster.host2):
        assert f"from node {host.address}: " in output, output[-6000:]
    assert "Authorization: Bearer ***" in output  # the echo reached the output, scrubbed
    assert _found_anywhere(cluster, key, output) == {"files": [], "host 2 inside": [], "output": []}


def test_an_extra_naming_another_endpoint_is_refused_on_the_cluster_path(
    cluster: TwoHosts,
) -> None:
    seen, output = _drive(cluster, "extra", canary(), "extra")
    assert seen["status"] == 2, output[-4000:]
    assert "model.extra.api_base" in output
    assert seen["requests"] == [0, 0]  # neither the model's endpoint nor the other host


def _join_on_host1(hosts: TwoHosts, env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", hosts.host1.netns, str(VENV_BIN / "python"), "-c", JOIN,
         hosts.head_address],
        env=dict(env), cwd=hosts.host1.dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _join_on_host2(hosts: TwoHosts, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """A process of host 2 (its network and mount namespaces), with only `env`."""
    return subprocess.Popen(
        ["nsenter", "-t", str(hosts.pids["host2"]), "-n", "-m", "--", "env", "-i",
         *(f"{k}={v}" for k, v in env.items()), str(VENV_BIN / "python"), "-c", JOIN,
         hosts.head_address, hosts.host2.address],
        env={"PATH": "/usr/bin:/bin"}, cwd="/", stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _outcome(process: subprocess.Popen[str]) -> str:
    try:
        out, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return "HANGS " + out + err
    return out + err


def _without(env: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in set(names)}


def test_no_process_without_the_token_joins_from_either_host_and_the_run_completes(
    cluster: TwoHosts,
) -> None:
    key = canary()
    data = cluster.data
    driver = cluster.popen(
        [str(VENV_BIN / "python"), "-c", *_driver_args(cluster, "gated", "gated")],
        env={KEY_VAR: key},
    )
    try:

        def asked() -> bool:  # the run is going: its replicas asked
            assert driver.poll() is None, driver.communicate()[1][-6000:]
            return (data / "gated.asked").exists()

        wait_for("the gated run's first query", asked, deadline_s=600)
        auth = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
        # Strangers: no token at all (Ray's default mode, or auth switched off), a wrong one.
        wrong = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        off = {"RAY_AUTH_MODE": "disabled"}
        # Host 1: the driver's own environment, then without the token and with another HOME.
        home1 = cluster.host1.dir / "stranger-home"
        home1.mkdir(exist_ok=True)
        env1 = cluster.host1_env()
        # Two connection attempts, not Ray's twenty: the cluster is up and would admit them.
        brief = {"RAY_gcs_server_port_wait_time_s": "2"}
        stranger1 = _without(env1, auth) | {"HOME": str(home1)} | brief
        # Host 2: as its node's processes, then without the token (and another HOME).
        home2 = cluster.host2.dir / "stranger-home"
        home2.mkdir(exist_ok=True)
        env2 = cluster.host2_environment()
        stranger2 = _without(env2, auth) | {"HOME": str(home2)} | brief
        # All at once.
        trying = {
            "host 1, token": _join_on_host1(cluster, env1),
            "host 1, none": _join_on_host1(cluster, stranger1),
            "host 1, disabled": _join_on_host1(cluster, stranger1 | off),
            "host 1, wrong": _join_on_host1(cluster, stranger1 | wrong),
            "host 2, token": _join_on_host2(cluster, env2),
            "host 2, none": _join_on_host2(cluster, stranger2),
            "host 2, disabled": _join_on_host2(cluster, stranger2 | off),
            "host 2, wrong": _join_on_host2(cluster, stranger2 | wrong),
        }
        tried = {name: _outcome(process) for name, process in trying.items()}
        assert driver.poll() is None  # all of it while the run was going (it waits on us)
    finally:
        (data / "gated.open").touch()
    stdout, stderr = driver.communicate(timeout=900)
    seen, output = _result(stdout, stderr, cluster)
    joined = {name: text.startswith("JOINED 2.0") for name, text in tried.items()}
    assert joined == {name: name.endswith("token") for name in tried}, tried
    for name, text in tried.items():  # refused by the GCS for the token, nothing else
        if not name.endswith("token"):
            assert text.startswith("REFUSED "), (name, text[-2000:])
            assert "InvalidAuthToken: Authentication token is missing or incorrect" in text, (
                name,
                text[-2000:],
            )
    assert seen["status"] == 0, output[-6000:]
    assert seen["statuses"] == ["completed"] * 4, output[-6000:]
    assert key not in output
