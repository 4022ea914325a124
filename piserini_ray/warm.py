"""What an idle Ray worker loads before any actor is handed to it: the model client's
third-party modules (litellm and what it imports: seconds of CPU).

With `RAY_enable_worker_prestart=1`, Ray starts idle Python workers on every node when the node
starts (one per CPU), and each imports the modules that `RAY_preload_python_modules` names (both
in the environment of `ray start`) before it takes work. With this module named there, a
searcher replica that takes such a worker starts with litellm loaded: its imports were paid
while the cluster sat idle, not at the start of every run on every node at once. A cluster
names both in each node's `ray start` (`cluster.yaml`, `docs/guides/cluster.md`, the KubeRay
manifests). A local Ray that a run starts sets neither: it has no idle time to pay them in
(measured: pre-started workers loading litellm during its start made the run slower).

Ray preloads in every Python worker it starts, also the ones it starts later for a job's
light actors (the driver's node's services: `driver_services.py`), which never use a model
client. So this module loads only in a worker Ray pre-started for no job (`RAY_JOB_ID` is the
nil job's id: the ones `ray start` pre-starts while the cluster sits idle); a worker started
for a job's actor loads nothing, so a light actor takes no more than Ray's own start-up, and a
replica on such a worker (a later run, Ray did not pre-start new ones) loads the client itself,
on its import thread, as on a Ray without the setting.

Third-party modules only: a worker keeps what it preloaded for its life, and this package's own
modules, loaded before a code update on disk, would run stale while `code_identity` (which reads
the files) vouched for the new code. So the node's JVM class archive, if it is missing, is made
by a process of its own (`make_class_archive`).
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import threading

#: This module, as `RAY_preload_python_modules` (each node's `ray start`) names it.
PRELOAD = "piserini_ray.warm"
#: Ray's variable for the job a worker process was started for, and its value for none.
JOB_VARIABLE = "RAY_JOB_ID"
NO_JOB = "ffffffff"
#: What the replicas' model client imports that takes seconds (the package's own
#: `LITELLM_LOCAL_MODEL_COST_MAP` is set by `piserini_ray/__init__.py`, imported first):
#: litellm (3-4 s of CPU) and the OpenAI SDK's resources, which it loads on its first call
#: (half a second, in every node's model check); numpy, which the replica's own modules import
#: (the document store); and what litellm imports lazily on its first call of a route
#: (`FIRST_CALL`: a tenth of a second more in that check, which the first query waits for).
MODULES = ("litellm", "openai.resources", "orjson", "numpy")
#: litellm's modules that its first call imports (the proxy's types, a route's lazily loaded
#: config, its service logger), as the pinned litellm has them; tests/test_warm.py fails when
#: a first call through the model client imports any litellm module not loaded by now.
FIRST_CALL = (
    "litellm._service_logger",
    "litellm.integrations.prometheus_services",
    "litellm.llms.litellm_proxy.chat.transformation",
    "litellm.llms.openai_like.dynamic_config",
    "litellm.llms.vertex_ai.vertex_ai_partner_models.anthropic.transformation",
    "litellm.proxy.openai_files_endpoints.common_utils",
)


def preloading() -> bool:
    """Whether Ray is preloading this module now: it starts such a worker with the flag
    `--worker-preload-modules=...,piserini_ray.warm`. Anyone else importing it (a driver, for
    its names; a worker of a Ray without the setting, through the package) loads nothing."""
    flag = "--worker-preload-modules="
    named = (arg.removeprefix(flag).split(",") for arg in sys.argv if arg.startswith(flag))
    return any(PRELOAD in names for names in named)


def prestarted() -> bool:
    """Whether this worker was pre-started for no job (by `ray start`), not for a job's
    actor or task."""
    return os.environ.get(JOB_VARIABLE, NO_JOB) == NO_JOB


def load() -> list[str]:
    """Import `MODULES` while Ray preloads this module in a worker it pre-started for no job;
    the names imported."""
    if not preloading() or not prestarted():
        return []
    make_class_archive()  # beside the imports: done before the worker is idle
    for name in MODULES:
        importlib.import_module(name)
    return [*MODULES, *first_call()]


def archive_mutex() -> str:
    """The name of the node's mutex for `make_class_archive`: a Unix socket in Linux's abstract
    namespace (one per network namespace, so per node, and gone with the process that holds
    it: no file left on the node)."""
    return f"\0piserini-ray-class-archive-{os.getuid()}"


def make_class_archive() -> subprocess.Popen[bytes] | None:
    """Have the node's JVM class archive made if it is missing (`retrieval/class_archive.py`:
    2 s of CPU once per install, which every replica's JVM then saves; a look that finds it
    costs a fraction of a second), by a process of its own: this one imports none of the
    package's modules (see the module's docstring). One worker of a node does it, the one
    that takes `archive_mutex` (the others, and a system without such sockets: None). A
    failure is said in the worker's log; the replicas then boot without the archive."""
    mutex = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        mutex.bind(archive_mutex())
    except OSError:  # another worker of the node holds it
        mutex.close()
        return None
    command = [sys.executable, "-m", "piserini_ray.retrieval._archive_main"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def wait() -> None:
        with mutex:  # held until the child exits
            child.wait()

    threading.Thread(target=wait, name="class-archive", daemon=True).start()
    return child


def first_call() -> list[str]:
    """Import `FIRST_CALL`; the names imported. One that a litellm release moved is skipped:
    its first call then imports it, as it would without this."""
    loaded = []
    for name in FIRST_CALL:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
    return loaded


load()
