"""Two hosts on a private network, for tests of a real cluster (issue 25).

`TwoHosts` makes two network namespaces joined by a veth pair with a random 10.x.y.0/24 that
exists only inside them (both ends are created inside; no route leads out, so nothing beyond
the two namespaces is ever addressed; each has its own `lo`, so each host its own 127.0.0.1),
and starts Ray on them with `ray start --block`:

- host 1, the driver's machine: `ip netns exec NS1 ray start --head --node-ip-address ADDR1`,
  in the test's environment plus `head_env`; drivers run there too (`run`, `python`, `popen`),
  in that environment plus their own `env`;
- host 2, a bare node: `ip netns exec NS2 unshare -m --propagation private sh -c '...mounts...;
  exec env -i PATH=... HOME=... ray start --address ADDR1:PORT --node-ip-address ADDR2 --block'`.
  In its own mount namespace it has an empty /tmp of its own (only its own folder, on the real
  disk so that its logs outlive it, is moved back in, and the virtual environment and the
  package where they live under /tmp, as on a node that has them installed: host 1's folders,
  the driver's data folder `TwoHosts.data`, the rest of a checkout under /tmp and pytest's tmp
  dirs are not there), an empty /dev/shm, and a tmpfs over its
  HOME, its `PISERINI_RAY_HOME`, the driver's `~/.cache` (the whole HOME unless Python lives in
  it, as pyenv's does) and whatever `hide` names. Its environment is only PATH, HOME, LANG,
  PISERINI_RAY_HOME, Ray's switches (`RAY_SWITCHES`), the path of its copy of the cluster's
  token (token authentication is on, as on every Ray we start) and `host2_env`: nothing of the
  driver's, no `*_API_KEY`. It has the package (the same venv on the same disk), nothing else.

Teardown (`close`, also on a failed `start`) stops every process by PID: each `ray start
--block` gets SIGTERM (its handler drains and stops that node's GCS, raylet, agents and
workers), SIGKILL after a bound; then whatever still lives in either namespace (found by the
namespaces' inodes in /proc/*/ns/net, so no process outside them can be named) gets the same;
then the veth pair and the namespaces are deleted and the folder removed. Where namespaces
cannot be made (not root, no `ip` or `unshare`, either refused) `skip_reason()` says why and
`require_two_hosts()` skips.

What we found out (Ray 2.60 on this machine: 2 cores, shared with other jobs):

- `--node-ip-address` is needed and suffices: no default route, DNS or gateway exists in the
  namespaces and none is needed. Without it Ray probes a UDP route to 8.8.8.8 (it logs "Failed
  to determine local IP via external connectivity", even with the flag), then falls back to the
  hostname, which resolves to 127.0.0.1 here: a node that advertises 127.0.0.1 to the cluster.
- Both hosts share the machine's PID namespace, and Ray looks at it: `ray.init(address=...)`
  finds "its" node by scanning the process table for raylets' `--node_id` (it sees host 2's
  raylet, and any other Ray's on the machine), keeps those of this cluster and prefers the head
  (`services.get_node_to_connect_for_driver`). Right for a driver on host 1; a driver on host 2
  picks host 1's node and dies in C++ ("Failed to connect to socket at address: <host 1's temp
  dir>/.../sockets/raylet", a core dump, not an exception) unless it passes
  `ray.init(..., _node_ip_address=ADDR2)` (tried with nsenter into host 2).
- tests/conftest.py sets `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` for the test process. Despite its
  name it is Ray's multi-node switch on Linux too: with it at 0 a worker node's `ray start
  --address` aborts ("Multi-node Ray clusters are not supported on Windows and OSX"), and
  `get_node_ip_address()` before `ray.init` is 127.0.0.1. Every host here sets it to 1.
- How they bind (`ss -ltn` in each namespace, `listening()`): the C++ servers ignore
  `--node-ip-address` for binding, it is only the address they advertise: the GCS (`*:6379`),
  the raylet's node-manager and object-manager ports and every worker's and driver's gRPC port
  (10002-19999) listen on all addresses, IPv4 and IPv6, loopback included. The Python agents
  bind the node IP (runtime-env agent; dashboard agent's HTTP 52365, also on 127.0.0.1), the
  Ray client server 10001 on the node IP and 127.0.0.1, and the autoscaler monitor (44217) and
  the headless dashboard that `--include-dashboard=false` still starts (44227) on 0.0.0.0. So on
  a real host, anything that reaches any of its addresses reaches the GCS and the raylets.
- Which ports cross between hosts (established connections on the veth while a task ran on
  each node with a 20 MB argument): host 2 to host 1's GCS port (its `ray start`, raylet,
  agents, log monitor and each worker), host 2's worker to the driver's worker port, host 1's
  GCS and driver to host 2's node-manager port, the driver to host 2's worker port, and the two
  raylets' object-manager ports both ways. No agent, dashboard or metrics port was used across
  hosts. Ray's fixed defaults (6379, 10001, 52365, 44217, 44227, 8265) are free in a fresh
  namespace, so no port is chosen at random and nothing collides with another Ray here.
- Host 2 may start at the same time as the head: its `ray start --address` waits for the GCS.
  It honours its own `--temp-dir` (its session folder has the head's session name).
- Bring-up (both `ray start` launched to 2 alive nodes seen by a driver): 8-21 s here, with
  the machine's load (other jobs share its 2 cores). In a quiet run the head's `ray start` took
  4 s and host 2's 6 s (launched at the same instant, it waits for the GCS); the waiting
  driver's start and connect take the rest. `close()`: 2-3 s: each node "drains for up to
  30 s" on SIGTERM but is done in 0.5 s, and nothing outlived the `ray start` processes, not
  even a SIGKILLed one's (Ray gives its children a parent-death signal on Linux).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers import file_tail

import piserini_ray

VENV_BIN = Path(sys.executable).parent
#: The virtual environment, and the package it imports (an editable install points at the
#: checkout): what a real node has installed, so host 2 sees them wherever they are.
VENV = Path(sys.prefix)
PACKAGE = Path(piserini_ray.__file__).resolve().parent
#: The model server's environment beside the checkout (`make serving`).
SERVING_VENV = PACKAGE.parent / ".venv-serving"
#: Ray's switches every host gets: no telemetry, token authentication on (the kit's own
#: token, in a 0600 file on each host, unless a test names another with RAY_AUTH_TOKEN).
RAY_SWITCHES = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",  # Ray's multi-node switch (0 in conftest)
    "RAY_AUTH_MODE": "token",
    "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1",
    # Idle workers on every node from its start, with the model client loaded before a replica
    # takes one, as docs/guides/cluster.md has every node's `ray start` do (`piserini_ray/warm.py`).
    "RAY_enable_worker_prestart": "1",
    "RAY_preload_python_modules": "piserini_ray.warm",
}
#: Variables of the test's environment that must not leak into host 1 or its drivers.
DROPPED = ("RAY_ADDRESS", "RAY_TMPDIR", "RAY_AUTH_TOKEN_PATH")


def _private_file(path: Path, text: str) -> Path:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    return path


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60)


@functools.cache
def skip_reason() -> str | None:
    """Why two hosts cannot be made here (for `pytest.skip`), or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if not Path("/mnt").is_dir():
        return "/mnt is missing (host 2's own folder is moved through it)"
    probe = f"prhprobe-{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    try:
        tried = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "-m", "--propagation", "private",
             "sh", "-c", "mount -t tmpfs tmpfs /mnt && umount /mnt"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if tried.returncode != 0:
            return f"`unshare -m` with a tmpfs refused: {tried.stderr.strip()}"
    finally:
        _ip("netns", "del", probe)
    return None


def require_two_hosts() -> None:
    """Skip the calling test, with the reason, where two hosts cannot be made."""
    import pytest

    if reason := skip_reason():
        pytest.skip(f"two hosts cannot be made here: {reason}")


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of its stat): with the PID, its identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None  # a zombie has exited
    return fields[19]


def alive(process: tuple[int, str]) -> bool:
    """Whether `(pid, start time)` (from `TwoHosts.seen`) is still the same running process."""
    return _start_time(process[0]) == process[1]


def _signal(process: tuple[int, str], sig: int) -> None:
    """Signal `(pid, start time)` through a pidfd, so a PID reused in between is never hit."""
    try:
        fd = os.pidfd_open(process[0])
    except OSError:
        return  # gone
    try:
        if alive(process):  # the pidfd is this very process: its PID cannot be reused now
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class Host:
    """One host: its namespace, address, folders and `ray start --block` process."""

    name: str
    netns: str
    address: str
    dir: Path
    #: Ray's `--temp-dir` (host 2's is on the real disk, so its logs outlive it).
    temp_dir: Path
    #: `ray start`'s stdout and stderr.
    log: Path
    process: subprocess.Popen[bytes] | None = None
    netns_inode: int | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not started"
        return self.process.pid

    def logs_tail(self, lines: int = 20) -> str:
        parts = [f"===== {self.name} ({self.address}): ray start =====", file_tail(self.log, lines)]
        logs = self.temp_dir / "session_latest" / "logs"
        for name in ("gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err"):
            if (logs / name).exists():
                parts += [f"----- {self.name}: {name} -----", file_tail(logs / name, lines)]
        return "\n".join(parts)


@dataclass
class TwoHosts:
    """Two hosts on a private network with Ray started on both. Use it as a context manager
    (`with TwoHosts(head_env=...) as hosts: hosts.wait_for_nodes(); hosts.python(...)`) or
    `start()` and `close()` it in a fixture.

    - `head_env`: added to host 1's environment (the shell its `ray start` runs in): a key set
      here reaches host 1's workers, as a key exported before `ray start --head` would;
    - `host2_env`: host 2's only variables besides PATH, HOME, PISERINI_RAY_HOME and Ray's
      switches;
    - `hide`: more folders host 2 sees as empty tmpfs (e.g. a shared data folder; anything
      under /tmp, pytest's tmp_path included, is not there for host 2 anyway);
    - `num_cpus`, `object_store_mb`: per host; `port`: the GCS's.
    """

    head_env: Mapping[str, str] = field(default_factory=dict)
    host2_env: Mapping[str, str] = field(default_factory=dict)
    hide: Sequence[Path] = ()
    num_cpus: int = 1
    #: Custom Ray resources of host 2 (`ray start --resources`), e.g. a label for the node
    #: that serves a model.
    host2_resources: Mapping[str, float] = field(default_factory=dict)
    object_store_mb: int = 200
    port: int = 6379
    #: Keep the folder (logs, temp dirs) after `close()`, for debugging.
    keep: bool = False

    def __post_init__(self) -> None:
        tag = secrets.token_hex(3)
        # Ray's socket paths must stay short: the root goes under /tmp, not pytest's tmp_path.
        self.root = Path(tempfile.mkdtemp(prefix=f"prh-{tag}-", dir="/tmp"))
        #: The driver's data folder (made by `start`): host 1 reads it, host 2 has no such path.
        self.data = self.root / "data"
        self.subnet = f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}"
        self.veth = (f"prv1-{tag}", f"prv2-{tag}")
        self.host1, self.host2 = (
            Host(
                name=f"host{n}",
                netns=f"prh{n}-{tag}",
                address=f"{self.subnet}.{n}",
                dir=self.root / f"host{n}",
                temp_dir=self.root / f"host{n}" / "ray",
                log=self.root / f"host{n}" / "ray-start.log",
            )
            for n in (1, 2)
        )
        #: host 1's `PISERINI_RAY_HOME` (the driver's), and host 2's (a tmpfs).
        self.piserini_home = (self.host1.dir / "piserini-home", self.host2.dir / "piserini-home")
        self.host2_home = self.host2.dir / "home"
        #: The cluster's token: host 1 reads this file, host 2 a copy in its own folder.
        self.token = secrets.token_hex(32)
        self.token_files = (self.root / "auth_token", self.host2.dir / "auth_token")
        #: Every process seen in either namespace: `(pid, start time)`.
        self.seen: set[tuple[int, str]] = set()
        #: What still lived in the namespaces once both `ray start` processes had exited.
        self.left_after_ray_start: set[tuple[int, str]] = set()
        self.made_netns: list[str] = []
        self.closed = False

    # -- the hosts' addresses and environments ------------------------------------------

    @property
    def head_address(self) -> str:
        """The GCS's address, `ray.init(address=...)` and `ray start --address` take it."""
        return f"{self.host1.address}:{self.port}"

    @property
    def pids(self) -> dict[str, int]:
        """Each host's `ray start --block` PID."""
        return {host.name: host.pid for host in (self.host1, self.host2)}

    @property
    def netns(self) -> tuple[str, str]:
        return self.host1.netns, self.host2.netns

    def host1_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Host 1's environment (the test's, `head_env`, Ray's switches), plus `env`."""
        base = {k: v for k, v in os.environ.items() if k not in DROPPED}
        return base | RAY_SWITCHES | {
            "PISERINI_RAY_HOME": str(self.piserini_home[0]),
            "RAY_AUTH_TOKEN_PATH": str(self.token_files[0]),
        } | {**self.head_env, **(env or {})}  # fmt: skip

    def host2_environment(self) -> dict[str, str]:
        return RAY_SWITCHES | {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.host2_home),
            "LANG": "C.UTF-8",
            "PISERINI_RAY_HOME": str(self.piserini_home[1]),
            "RAY_AUTH_TOKEN_PATH": str(self.token_files[1]),
            **self.host2_env,
        }

    def host2_installed(self) -> list[Path]:
        """What host 2 keeps of the driver's files under /tmp (which it otherwise has empty):
        its own folder, and the virtual environment, the package and Python wherever they
        are, as a node that has the package installed. Nothing else of the checkout."""
        own = [self.host2.dir]
        # The model server's environment (`make serving`): a node that has the engine.
        installed = [VENV, PACKAGE, Path(sys.base_prefix).resolve()]
        installed += [SERVING_VENV] if SERVING_VENV.is_dir() else []
        return own + [p for p in dict.fromkeys(installed) if p.is_relative_to("/tmp")]

    def host2_hidden(self) -> list[Path]:
        """The folders host 2 sees as empty tmpfs, besides /tmp and /dev/shm (which it has
        of its own, with only its own folder in /tmp): its HOME and PISERINI_RAY_HOME, the
        driver's ~/.cache (its whole HOME unless Python, the venv or this checkout is in it)
        and `hide` (those under /tmp are hidden already)."""
        home = Path.home()
        driver_home = [home / ".cache"]
        needed = (VENV_BIN, Path(sys.base_prefix).resolve(), Path(__file__).resolve())
        if not any(p.is_relative_to(home) for p in needed):
            driver_home = [home]
        outside = [self.data, *driver_home, *map(Path, self.hide)]
        outside = [p for p in outside if p.is_dir() and not p.is_relative_to("/tmp")]
        return list(dict.fromkeys([self.host2_home, self.piserini_home[1], *outside]))

    # -- bring-up ---------------------------------------------------------------------

    def start(self) -> TwoHosts:
        """Make the network and start Ray on both hosts (not waiting for them: see
        `wait_for_nodes`)."""
        reason = skip_reason()
        if reason:
            raise RuntimeError(f"two hosts cannot be made here: {reason}")
        try:
            self._make_network()
            for path in (self.data, *self.piserini_home, self.host2_home):
                path.mkdir(parents=True, exist_ok=True)
            for host in (self.host1, self.host2):
                host.temp_dir.mkdir(parents=True, exist_ok=True)
            for path in self.token_files:
                _private_file(path, self.token)
            self._start_host1()
            self._start_host2()
        except BaseException:
            self.close()
            raise
        return self

    def _make_network(self) -> None:
        one, two = self.host1, self.host2
        steps = [
            ("netns", "add", one.netns),
            ("netns", "add", two.netns),
            # Both ends are made inside the namespaces: nothing appears in the machine's own.
            ("link", "add", self.veth[0], "netns", one.netns, "type", "veth",
             "peer", "name", self.veth[1], "netns", two.netns),
        ]  # fmt: skip
        for host, veth in ((one, self.veth[0]), (two, self.veth[1])):
            steps += [
                ("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", veth),
                ("-n", host.netns, "link", "set", "lo", "up"),
                ("-n", host.netns, "link", "set", veth, "up"),
            ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                raise RuntimeError(f"ip {' '.join(step)}: {done.stderr.strip()}")
            if step[:2] == ("netns", "add"):
                self.made_netns.append(step[2])
        for host in (one, two):
            host.netns_inode = os.stat(f"/run/netns/{host.netns}").st_ino

    def _ray_start(self, host: Host) -> list[str]:
        resources = dict(self.host2_resources) if host is self.host2 else {}
        return [
            str(VENV_BIN / "ray"), "start", "--block",
            f"--node-ip-address={host.address}", f"--num-cpus={self.num_cpus}",
            f"--object-store-memory={self.object_store_mb << 20}",
            f"--temp-dir={host.temp_dir}", "--disable-usage-stats",
            *([f"--resources={json.dumps(resources)}"] if resources else []),
        ]  # fmt: skip

    def _start_host1(self) -> None:
        command = [
            *self._ray_start(self.host1),
            "--head",
            f"--port={self.port}",
            "--include-dashboard=false",
        ]
        with self.host1.log.open("wb") as log:
            self.host1.process = subprocess.Popen(
                ["ip", "netns", "exec", self.host1.netns, *command],
                env=self.host1_env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.host1.dir,
            )  # fmt: skip

    def _start_host2(self) -> None:
        command = [*self._ray_start(self.host2), f"--address={self.head_address}"]
        env = [f"{k}={v}" for k, v in self.host2_environment().items()]
        # In its own mount namespace, sh gives host 2 an empty /tmp with only the folders before
        # `+` in it (its own, and the venv and package when they live under /tmp: each bound
        # to a staging point on a tmpfs at /mnt, then moved back to its path) and an empty
        # /dev/shm, mounts a tmpfs over each folder between `+` and `--`, then execs what
        # follows: the PID we hold becomes `ray start`'s (ip netns exec, unshare, sh and env
        # all exec).
        script = (
            "set -e; mount -t tmpfs tmpfs /mnt; n=0; "
            'for d; do [ "$d" = + ] && break; n=$((n+1)); mkdir /mnt/$n; '
            'mount --bind "$d" /mnt/$n; done; '
            "mount -t tmpfs tmpfs /tmp; n=0; "
            'while [ "$1" != + ]; do n=$((n+1)); mkdir -p "$1"; mount --move /mnt/$n "$1"; '
            "shift; done; shift; umount /mnt; mount -t tmpfs tmpfs /dev/shm; "
            'while [ "$1" != -- ]; do mount -t tmpfs tmpfs "$1"; shift; done; shift; exec "$@"'
        )
        kept = [str(p) for p in self.host2_installed()]
        hidden = [*kept, "+", *map(str, self.host2_hidden())]
        with self.host2.log.open("wb") as log:
            self.host2.process = subprocess.Popen(
                ["ip", "netns", "exec", self.host2.netns,
                 "unshare", "-m", "--propagation", "private",
                 "sh", "-c", script, "sh", *hidden, "--",
                 "env", "-i", *env, *command],
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd="/",
            )  # fmt: skip

    def wait_for_nodes(self, count: int = 2, deadline_s: float = 240) -> list[dict]:
        """Wait until the cluster has `count` alive nodes (asked from a driver in host 1): their
        `ray.nodes()` entries. Past the deadline, or if a host's `ray start` exits, raises
        with both hosts' log tails."""
        script = textwrap.dedent(
            """
            import json, sys, time, ray
            count, end = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
            ray.init(address=sys.argv[1], log_to_driver=False)
            while True:
                nodes = [n for n in ray.nodes() if n["Alive"]]
                if len(nodes) >= count:
                    print(json.dumps(nodes, default=str))
                    break
                if time.monotonic() > end:
                    sys.exit(f"{len(nodes)} alive nodes: {nodes}")
                time.sleep(0.2)
            """
        )
        end = time.monotonic() + deadline_s
        last = ""
        while time.monotonic() < end:
            self._check_running()
            waiter = self.popen(
                [str(VENV_BIN / "python"), "-c", script, self.head_address, str(count),
                 str(max(1.0, end - time.monotonic()))],
            )  # fmt: skip
            while True:
                try:
                    out, err = waiter.communicate(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                try:
                    self._check_running()
                    assert time.monotonic() < end + 10, "the waiting driver hangs"
                except AssertionError:
                    waiter.kill()
                    waiter.communicate()
                    raise
            if waiter.returncode == 0:
                return list(json.loads(out.splitlines()[-1]))
            last = err[-2000:]
            time.sleep(0.5)  # the head's GCS was not up yet: ask again
        raise AssertionError(
            f"the cluster did not reach {count} alive nodes within {deadline_s:g} s; the last "
            f"driver said:\n{last}\n{self.logs_tail()}"
        )

    def _check_running(self) -> None:
        for host in (self.host1, self.host2):
            if host.process is not None and host.process.poll() is not None:
                raise AssertionError(
                    f"{host.name}'s ray start exited ({host.process.returncode})\n"
                    + self.logs_tail()
                )

    def logs_tail(self, lines: int = 20) -> str:
        return "\n".join(host.logs_tail(lines) for host in (self.host1, self.host2))

    # -- drivers and commands in host 1 ----------------------------------------------------

    def popen(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[str]:
        """`argv` started in host 1 (stdout and stderr piped, text). A driver imports the test
        kit from the checkout, as pytest does (no wheel ships it); host 1's Ray node does not."""
        base = self.host1_env(env)
        kit = os.pathsep.join(filter(None, [str(PACKAGE.parent), base.get("PYTHONPATH", "")]))
        return subprocess.Popen(
            ["ip", "netns", "exec", self.host1.netns, *argv],
            env=base | {"PYTHONPATH": kit}, cwd=cwd or self.host1.dir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` in host 1 (the driver's machine) in host 1's environment plus `env`: its
        exit code, stdout and stderr. Past `timeout` it is killed and an AssertionError says
        so with its output."""
        process = self.popen(argv, env=env, cwd=cwd)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(
                f"still running after {timeout:g} s: {argv}\n{out[-2000:]}\n{err[-3000:]}"
            ) from None
        return subprocess.CompletedProcess(list(argv), process.returncode, out, err)

    def python(
        self, code: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """`python -c code args...` with the venv's Python in host 1 (see `run`)."""
        return self.run([str(VENV_BIN / "python"), "-c", code, *args], env=env, timeout=timeout)

    def listening(self) -> dict[str, str]:
        """`ss -ltnp` in each namespace: which of Ray's processes listen on which address."""
        return {
            host.name: subprocess.run(
                ["ip", "netns", "exec", host.netns, "ss", "-ltnp"],
                capture_output=True, text=True, timeout=60,
            ).stdout
            for host in (self.host1, self.host2)
        }  # fmt: skip

    # -- teardown ---------------------------------------------------------------------

    def processes(self) -> set[tuple[int, str]]:
        """Every live process in either namespace, `(pid, start time)`: by the namespaces'
        inodes, so a process outside them is never named (even if ours by origin)."""
        inodes = {h.netns_inode for h in (self.host1, self.host2)} - {None}
        found: set[tuple[int, str]] = set()
        if not inodes:
            return found
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino in inodes:
                    started = _start_time(int(entry.name))
                    if started is not None:
                        found.add((int(entry.name), started))
        return found

    def close(self, grace_s: float = 45) -> None:
        """Stop every process by PID (each `ray start --block` first, SIGTERM, then SIGKILL
        after `grace_s`), then anything left in the namespaces, then delete the veth pair and
        the namespaces. Safe to call twice and after a partial `start()`."""
        if self.closed:
            return
        self.closed = True
        try:
            self.seen |= self.processes()
            starts = [h.process for h in (self.host2, self.host1) if h.process is not None]
            for process in starts:
                self.seen.add((process.pid, _start_time(process.pid) or "?"))
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
            end = time.monotonic() + grace_s
            for process in starts:
                try:
                    process.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(grace_s)
            self.left_after_ray_start = self.processes()
            self._stop_leftovers(grace_s)
        finally:
            if self.made_netns:
                _ip("-n", self.made_netns[0], "link", "del", self.veth[0])
            for name in self.made_netns:
                _ip("netns", "del", name)
            if not self.keep:
                shutil.rmtree(self.root, ignore_errors=True)

    def _stop_leftovers(self, grace_s: float) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = self.processes()
            self.seen |= left
            for process in left:
                _signal(process, sig)
            end = time.monotonic() + grace_s
            while time.monotonic() < end and any(alive(p) for p in left):
                time.sleep(0.1)

    def __enter__(self) -> TwoHosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def netns_exists(name: str) -> bool:
    return name in _ip("netns", "list").stdout.split()
