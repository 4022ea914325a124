"""Starting or joining Ray, sized explicitly (2-core machines and shared clusters alike)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from piserini_ray.config import RuntimeConfig


def cluster_address(runtime: RuntimeConfig) -> str | None:
    return runtime.address or os.environ.get("RAY_ADDRESS")


#: Ray's C++ failure signal handler replaces the JVM's SIGSEGV handling (which the JVM uses on
#: purpose, for safepoints and null checks): a process with both then dies at random. Every
#: process that may hold a JVM next to Ray gets this (Ray documents the same for Java users).
JVM_SAFE_ENV = {"RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1"}


def prepare_local_ray() -> None:
    """Settings for a local instance: no telemetry, no token auth to set up, loopback addresses
    only, and the JVM-safe signal setting. Ray reads these when it is imported: call this
    before."""
    for key, value in JVM_SAFE_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def start_ray(runtime: RuntimeConfig, log: Callable[[str], None] = lambda _m: None) -> None:
    """Join the cluster at `runtime.address`, or start a local instance with explicit CPUs, a
    capped object store and no dashboard unless asked. Idempotent."""
    import ray

    if ray.is_initialized():
        return
    # The driver's own C++ failure handler would print a crash trace for a plain SIGTERM (what
    # `ray job stop` and schedulers send); and ray.init replaces our SIGTERM handler (a clean
    # stop, like Ctrl-C) with sys.exit: set the one, restore the other.
    for key, value in JVM_SAFE_ENV.items():
        os.environ.setdefault(key, value)
    main = threading.current_thread() is threading.main_thread()
    ours = signal.getsignal(signal.SIGTERM) if main else None
    address = cluster_address(runtime)
    if address:
        ray.init(address=address, log_to_driver=True)
        log(f"joined the Ray cluster at {address}: {ray.cluster_resources().get('CPU', 0):g} CPUs")
    else:
        prepare_local_ray()
        num_cpus = runtime.num_cpus or os.cpu_count() or 1
        # "local": a new instance, even where `ray start` (or a test cluster) left an address
        # file that a bare ray.init() would attach to, and then refuse our num_cpus.
        ray.init(
            address="local",
            num_cpus=num_cpus,
            object_store_memory=runtime.object_store_mb * 2**20,
            include_dashboard=runtime.dashboard,
            log_to_driver=True,
        )
        log(
            f"started a local Ray instance: {num_cpus} CPUs, object store "
            f"{runtime.object_store_mb} MB"
        )
    if main and callable(ours):
        signal.signal(signal.SIGTERM, ours)
