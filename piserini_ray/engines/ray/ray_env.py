"""Starting or joining Ray, sized explicitly (2-core machines and shared clusters alike), and
letting go of it.

Starting a local Ray takes seconds (its processes boot while this one waits), so a command
starts it in the background (`start_ray_async`) as soon as it has its config, and checks its
data and imports its modules meanwhile; `start_ray` waits for that same start. At the end,
`release_ray_async` shuts it down while the reports are written.

Ray's processes die with the *thread* that started them (Linux `PR_SET_PDEATHSIG` follows
threads), so the thread that starts Ray lives until Ray is let go, and shuts it down itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

from piserini_ray.config import RuntimeConfig
from piserini_ray.errors import ConfigError

Log = Callable[[str], None]


def cluster_address(runtime: RuntimeConfig) -> str | None:
    return runtime.address or os.environ.get("RAY_ADDRESS")


#: Ray's C++ failure signal handler, installed when a process joins Ray, replaces the JVM's
#: SIGSEGV handling (which the JVM uses on purpose, for safepoints and null checks) where the
#: JVM booted first: a driver that ran searches before `ray.init`, which then dies at random.
#: So a driver holds this before Ray is imported. A worker joins Ray before its actor can boot
#: a JVM, and the JVM's handler then goes in front of Ray's (tests/engines/ray/test_ray_env.py):
#: JVM actors need no runtime env, and take the workers Ray pre-started, on any node.
JVM_SAFE_ENV = {"RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1"}


#: How often a Ray process retries a Unix socket that is not listening yet, and how many times:
#: the same 10 s of patience as Ray's default (10 x 1 s) in steps of 0.1 s. The raylet connects
#: to its own object store as it starts, which races the store's thread: about every second
#: start lost that race and waited a whole second (measured: `ray.init` 1.55 s or 2.56 s).
CONNECT_RETRY_ENV = {
    "RAY_raylet_client_connect_timeout_milliseconds": "100",
    "RAY_raylet_client_num_connect_attempts": "100",
}


def prepare_local_ray() -> None:
    """Settings for a local instance: no telemetry, loopback addresses only, the JVM-safe
    signal setting, quick socket retries (`CONNECT_RETRY_ENV`), and Ray's token
    authentication on with a private token
    (`ensure_private_token`). Ray reads these when it is imported: call this before."""
    local = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    for key, value in {**JVM_SAFE_ENV, **local, **CONNECT_RETRY_ENV}.items():
        os.environ.setdefault(key, value)
    ensure_private_token()


#: Where Ray looks for its token when neither RAY_AUTH_TOKEN nor RAY_AUTH_TOKEN_PATH is set.
DEFAULT_TOKEN_PATH = Path("~/.ray/auth_token")


def ensure_private_token() -> Path | None:
    """Token authentication on (`RAY_AUTH_MODE=token`) with a token only this user can read.

    Whoever holds a Ray's token can run code as the driver's user and read its environment,
    keys included; without token auth, any process on the machine can (another user's too).
    So the run never turns it off, and refuses `RAY_AUTH_MODE=disabled` from the environment.
    The token is `RAY_AUTH_TOKEN`, else the file `RAY_AUTH_TOKEN_PATH`, else Ray's own
    `~/.ray/auth_token`, created here (0600) when missing. A token file that others can read is
    made private (0600). Returns the token file, or None when the token is a variable."""
    mode = os.environ.get("RAY_AUTH_MODE", "token").strip().lower()
    if mode != "token":
        raise ConfigError(
            f"RAY_AUTH_MODE={os.environ['RAY_AUTH_MODE']}: a local Ray without token "
            "authentication lets any process on this machine join it and run code as you "
            "(keys included). Unset RAY_AUTH_MODE (or set it to token)"
        )
    os.environ["RAY_AUTH_MODE"] = "token"
    path = None if os.environ.get("RAY_AUTH_TOKEN") else _private_token_file()
    _ray_reads_its_settings_again()
    return path


def _private_token_file() -> Path:
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or DEFAULT_TOKEN_PATH).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        # Created private from the first byte (no window with the umask's mode).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
    else:
        with os.fdopen(fd, "w") as token:
            token.write(secrets.token_hex(32))  # 256 bits, as Ray's own generator
    return path


def _ray_reads_its_settings_again() -> None:
    """A Ray imported before these settings (a notebook's `import ray` first) read its own at
    import, and its local instance then refused its own driver (`InvalidAuthToken`): it reads
    them again, as Ray does when it turns token auth on itself."""
    ray = sys.modules.get("ray")
    if ray is None or ray.is_initialized():
        return  # read at import, or a Ray already up (its settings are not ours to reset)
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


_lock = threading.Lock()
_startup: Future[None] | None = None
#: How this process's `start_ray` connected it: "started" the local instance or "joined" a
#: cluster; None when it did not (a Ray that the caller had up, a test's or an embedding
#: program's, which `release_ray_async` leaves alone).
_connected: Literal["started", "joined"] | None = None
#: The thread that started Ray (and holds it), and what tells it to let go.
_owner: threading.Thread | None = None
_let_go = threading.Event()


def start_ray(runtime: RuntimeConfig, log: Log = lambda _m: None) -> None:
    """Join the cluster at `runtime.address`, or start a local instance with explicit CPUs, a
    capped object store and no dashboard unless asked. Idempotent; waits for a start that
    `start_ray_async` began."""
    start_ray_async(runtime, log).result()


def start_ray_async(runtime: RuntimeConfig, log: Log = lambda _m: None) -> Future[None]:
    """`start_ray` on a background thread: the future is done when Ray is up (or holds why it
    could not start). Only the first call of a process starts anything."""
    global _startup, _owner, _let_go
    with _lock:
        if _startup is None or (_startup.done() and not _ray_is_up()):
            _startup = Future()
            if _ray_is_up():
                _startup.set_result(None)
            else:
                # Imported here, on the caller's thread: two threads importing the package's
                # modules at once have failed (KeyError: 'piserini_ray.retrieval').
                from piserini_ray.retrieval import jvm  # noqa: F401

                _let_go = threading.Event()
                # A daemon: a process that never lets go still exits (Ray's own atexit hook
                # then shuts it down).
                _owner = threading.Thread(
                    target=_own, args=(runtime, log, _startup, _let_go), name="ray", daemon=True
                )
                _owner.start()
        return _startup


def _ray_is_up() -> bool:
    # Without importing Ray (half a second) when nothing has yet: the start imports it.
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _own(runtime: RuntimeConfig, log: Log, done: Future[None], let_go: threading.Event) -> None:
    """Start (or join) Ray, then hold it until `let_go` is set, then shut it down."""
    # On the main thread ray.init replaces our SIGTERM handler (a clean stop, like Ctrl-C)
    # with sys.exit; on this one it leaves it, and warns that it did: that is what we want.
    quiet = _DropMessage("SIGTERM handler is not set")
    logging.getLogger("ray._private.worker").addFilter(quiet)
    try:
        address = cluster_address(runtime)
        if address:
            # The driver's own C++ failure handler would print a crash trace for a plain
            # SIGTERM (what `ray job stop` and schedulers send).
            for key, value in JVM_SAFE_ENV.items():
                os.environ.setdefault(key, value)
        else:
            prepare_local_ray()  # before Ray is imported (it includes the same setting)
        import ray

        from piserini_ray.retrieval.jvm import foreign_signal_handlers

        # ray.init turns faulthandler on in this process: never in front of a JVM.
        with foreign_signal_handlers():
            _init(runtime, address, log)
    except BaseException as exc:  # handed to whoever waits for the start
        done.set_exception(exc)
        return
    finally:
        logging.getLogger("ray._private.worker").removeFilter(quiet)
    done.set_result(None)
    let_go.wait()
    ray.shutdown()


def _init(runtime: RuntimeConfig, address: str | None, log: Log) -> None:
    """`ray.init`: join the cluster at `address`, or start a local instance."""
    global _connected
    import ray

    if address:
        ray.init(address=address, log_to_driver=True)
        _connected = "joined"
        cpus = ray.cluster_resources().get("CPU", 0)
        log(f"joined the Ray cluster at {address}: {cpus:g} CPUs")
        return
    num_cpus = runtime.num_cpus or os.cpu_count() or 1
    # "local": a new instance, even where `ray start` (or a test cluster) left an address file
    # that a bare ray.init() would attach to, and then refuse our num_cpus.
    # Metrics need the full dashboard agent (it serves them); the rest stays lean.
    exported = runtime.metrics_export_port
    metrics: dict[str, Any] = {} if exported is None else {"_metrics_export_port": exported}
    lean = not runtime.dashboard and lean_start_applies(ray.__version__, log)
    with _lean_start(lean, full_agent=exported is not None):
        ray.init(
            address="local",
            num_cpus=num_cpus,
            object_store_memory=runtime.object_store_mb * 2**20,
            include_dashboard=runtime.dashboard,
            log_to_driver=True,
            **metrics,
        )
    _connected = "started"
    log(f"started a local Ray instance: {num_cpus} CPUs, object store {runtime.object_store_mb} MB")


#: The Ray whose private functions `_lean_start` replaces (the one pyproject.toml pins). Any
#: other Ray starts the plain way: its private functions may take other arguments or mean
#: other things, and a run must not start differently unseen.
LEAN_START_RAY = "2.60.0"
_said_plain_start = False


def lean_start_applies(ray_version: str, log: Log) -> bool:
    """Whether the lean start may patch this Ray (`LEAN_START_RAY`); any other says once that
    a local Ray starts the plain way."""
    global _said_plain_start
    if ray_version == LEAN_START_RAY:
        return True
    if not _said_plain_start:
        _said_plain_start = True
        log(
            f"Ray {ray_version} is not the Ray {LEAN_START_RAY} that piserini_ray's lean local "
            "start was written for: a local Ray starts the plain way (its API server, "
            "autoscaler monitor and full dashboard agent too: a second or two more); install "
            f"ray=={LEAN_START_RAY} (requirements.lock) for the lean start"
        )
    return False


@contextlib.contextmanager
def _lean_start(lean: bool, full_agent: bool = False) -> Iterator[None]:
    """Within, when `lean`: a local Ray started here starts only what a run uses. Ray starts,
    even with `include_dashboard=False`, (1) the dashboard's API server, which `ray.init`
    waits for to publish its address (on 2 cores 1.2-1.7 s of the start and 1.2 s of CPU);
    (2) the autoscaler's monitor, which has nothing to scale on one machine, costs 0.3 s of
    CPU at the start and ignores SIGTERM at `ray.shutdown`, which waits a whole second for
    it before it kills it; (3) a full dashboard agent, after importing the dashboard's
    optional modules (aiohttp, OpenTelemetry: 0.3 s) to decide so, while the raylet waits for
    that agent before it registers. Without them Ray runs as it does when the API server
    fails to start, with `ray start --no-monitor`, and with a "minimal" agent (the one Ray
    starts where those modules are not installed). And `ray.init` finds its raylet
    registered as soon as it is (`_await_registration`), not on the next whole second. Ray
    2.60's own functions, replaced only for this start and only in Ray 2.60
    (`lean_start_applies`). `full_agent`: the dashboard agent starts whole (it serves the metrics
    export port), the rest stays lean."""
    if not lean:
        yield
        return
    from ray._private import node, services, utils

    def no_api_server(*_args: object, **_kwargs: object) -> tuple[None, None]:
        return None, None  # (its address, its process): what Ray keeps when it fails to start

    def no_monitor(_node: object) -> None:
        return None

    def no_dashboard_modules() -> ImportError:
        return ImportError("piserini_ray starts a local Ray without the dashboard")

    ray_get_node: Any = getattr(services, "get_node", None)

    def get_node(gcs_address: str, node_id: str) -> object:
        with contextlib.suppress(Exception):  # then Ray's own wait, as without this
            _await_registration(gcs_address, node_id)
        return ray_get_node(gcs_address, node_id)

    replaced = [
        (owner, name, original, replacement)
        for owner, name, replacement in (
            (services, "start_api_server", no_api_server),
            (node.Node, "start_monitor", no_monitor),
            (utils, "get_dashboard_dependency_error", no_dashboard_modules),
            (services, "get_node", get_node),
        )
        if (original := getattr(owner, name, None)) is not None
        and not (full_agent and name == "get_dashboard_dependency_error")
    ]
    for owner, name, _original, replacement in replaced:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original, _replacement in replaced:
            setattr(owner, name, original)


def _await_registration(gcs_address: str, node_id: str, patience: float = 30.0) -> bool:
    """Wait until the node `node_id` has registered with the GCS, asking every 50 ms: Ray's
    own `get_node` asks once a second, so a raylet registered 0.7 s after the question is
    found 0.3 s late (at most a second, on any machine). False: not within `patience`."""
    from ray._private import services, state

    cluster = state.GlobalState()
    cluster._initialize_global_state(services._get_gcs_client_options(gcs_address))
    try:
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            if any(node.get("NodeID") == node_id for node in cluster.node_table()):
                return True
            time.sleep(0.05)
        return False
    finally:
        cluster.disconnect()


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def cluster_can_grow() -> bool:
    """Whether this process joined a cluster (which an autoscaler may grow) rather than a Ray
    on this machine: a demand no node meets is then worth waiting for."""
    return _connected == "joined" or bool(os.environ.get("RAY_ADDRESS"))


def release_ray_async() -> threading.Thread | None:
    """Shut Ray down on a background thread if `start_ray` connected this process (the local
    instance ends; a cluster is only left), so that the reports are written meanwhile; join
    the returned thread before exiting. None when there is nothing to let go."""
    global _connected
    if _connected is None or _owner is None or not _ray_is_up():
        return None
    _connected = None
    _let_go.set()
    return _owner
