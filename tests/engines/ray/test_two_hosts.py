"""The two hosts of `tests/hosts.py` are real: a task pinned on host 2 has another IP, none of
the driver's environment (no marker, no key), none of its files and another 127.0.0.1; a task
pinned on host 1 has all of them. And when the helper is done, nothing it started is left.

What this taught us about Ray across namespaces (binding, ports, node IPs, timings) is in
tests/hosts.py's docstring."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator

import pytest
from hosts import PACKAGE, TwoHosts, alive, netns_exists, require_two_hosts

pytestmark = pytest.mark.slow

KEY = f"sk-test-{secrets.token_hex(8)}"
DRIVER_ENV = {"PISERINI_TEST_MARKER": "1", "OPENAI_API_KEY": KEY}

#: The driver, in host 1: a TCP server on its 127.0.0.1, then one task pinned on each node.
DRIVER = """
import hashlib, json, os, socket, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

address, data_file, checkout = sys.argv[1], sys.argv[2], sys.argv[3]
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
ray.init(address=address, log_to_driver=False)


@ray.remote(num_cpus=1, max_retries=0)
def look(data_file, port, checkout):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            tcp = "connected"
    except OSError as error:
        tcp = type(error).__name__
    key = os.environ.get("OPENAI_API_KEY")
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "marker": os.environ.get("PISERINI_TEST_MARKER"),
        "key_sha256": key and hashlib.sha256(key.encode()).hexdigest(),
        "api_keys": sorted(k for k in os.environ if k.endswith("_API_KEY")),
        "file": os.path.exists(data_file),
        "data_dir": os.path.isdir(os.path.dirname(data_file))
        and sorted(os.listdir(os.path.dirname(data_file))),
        "tmp": sorted(os.listdir("/tmp")),
        # The checkout the package comes from: whole on host 1; on host 2, where it lives
        # under /tmp, only what a node has installed of it.
        "checkout": sorted(os.listdir(checkout)),
        "tcp": tcp,
        "home": os.environ.get("HOME"),
    }


nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
pinned = [
    look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        data_file, port, checkout
    )
    for node in nodes
]
results = ray.get(pinned, timeout=240)
print(json.dumps({"nodes": nodes, "driver_ip": ray.util.get_node_ip_address(),
                  "results": {r["ip"]: r for r in results}}))
"""


@pytest.fixture
def hosts() -> Iterator[TwoHosts]:
    require_two_hosts()
    hosts = TwoHosts(head_env=DRIVER_ENV)
    try:
        yield hosts
    finally:
        hosts.close()


def test_host_2_has_nothing_of_the_driver_but_the_package(hosts: TwoHosts) -> None:
    began = time.monotonic()
    hosts.start()
    nodes = hosts.wait_for_nodes(2)
    up = time.monotonic() - began
    assert {n["NodeManagerAddress"] for n in nodes} == {hosts.host1.address, hosts.host2.address}
    data_file = hosts.data / "corpus.jsonl"
    data_file.write_text('{"docid": "d1", "text": "only the driver has me"}\n')

    checkout = PACKAGE.parent
    done = hosts.python(DRIVER, hosts.head_address, str(data_file), str(checkout), env=DRIVER_ENV)
    assert done.returncode == 0, done.stderr[-4000:] + "\n" + hosts.logs_tail()
    seen = json.loads(done.stdout.splitlines()[-1])
    one, two = hosts.host1.address, hosts.host2.address
    assert seen["driver_ip"] == one  # the driver is inside host 1's network
    assert sorted(seen["nodes"].values()) == sorted([one, two])
    results = seen["results"]
    assert set(results) == {one, two}, results  # one task ran on each node
    assert {r["node_id"] for r in results.values()} == set(seen["nodes"])

    key_hash = hashlib.sha256(KEY.encode()).hexdigest()
    on_1, on_2 = results[one], results[two]
    # Host 1, the driver's machine: its environment, its files, its loopback.
    assert on_1["ip"] == one
    assert on_1["marker"] == "1"
    assert on_1["key_sha256"] == key_hash and "OPENAI_API_KEY" in on_1["api_keys"]
    assert on_1["file"] is True and on_1["data_dir"] == ["corpus.jsonl"]
    assert on_1["tcp"] == "connected"
    assert hosts.root.name in on_1["tmp"]
    assert "pyproject.toml" in on_1["checkout"]
    # Host 2, a bare node: none of them. Where the checkout lives under /tmp (as a clone made
    # to try the project), host 2 sees its package and venv there and nothing else of it.
    installed = [p for p in hosts.host2_installed() if p.is_relative_to("/tmp")]
    tmp = sorted({p.relative_to("/tmp").parts[0] for p in installed})
    if checkout.is_relative_to("/tmp"):
        inside = {p.relative_to(checkout).parts[0] for p in installed if p.is_relative_to(checkout)}
        assert on_2.pop("checkout") == sorted(inside) and "tests" not in inside
    else:
        assert on_2.pop("checkout") == on_1["checkout"]  # the same disk, as the venv's
    assert on_2 | {"node_id": None} == {
        "node_id": None,
        "ip": two,
        "marker": None,
        "key_sha256": None,
        "api_keys": [],
        "file": False,
        "data_dir": False,  # the driver's data folder is not there at all
        "tmp": tmp,  # its own /tmp: its own folder, and the checkout's top where it is there
        "tcp": "ConnectionRefusedError",  # its own 127.0.0.1, where nothing listens
        "home": str(hosts.host2_home),
    }
    print(f"two hosts up in {up:.1f} s, both tasks done {time.monotonic() - began:.1f} s in")

    started = set(hosts.pids.values())
    namespaces = hosts.netns
    closing = time.monotonic()
    hosts.close()
    print(
        f"closed in {time.monotonic() - closing:.1f} s; "
        f"{len(hosts.left_after_ray_start)} processes outlived the ray start processes"
    )
    assert started <= {pid for pid, _ in hosts.seen}
    assert not [p for p in hosts.seen if alive(p)], "processes left after close()"
    assert not any(map(netns_exists, namespaces))
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert not any(veth in links for veth in hosts.veth)
    assert not hosts.root.exists()
