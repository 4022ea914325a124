"""What an idle Ray worker loads before any actor is handed to it: the model client's
third-party modules (litellm and what it imports: seconds of CPU).

With `RAY_enable_worker_prestart=1`, Ray starts idle Python workers on every node when the node
starts (one per CPU; without it, only on the first driver's node, when that driver connects),
and each imports the modules that `RAY_preload_python_modules` names (both in the environment
of `ray start`) before it takes work. With this module named there, a searcher replica that
takes such a worker starts with litellm loaded: its imports were paid while the cluster sat
idle, not at the start of every run on every node at once. A local Ray that piserini-ray
starts names it itself (`runtime/ray_env.py`); a cluster names it in each node's `ray start`
(`cluster.yaml`, `docs/guides/cluster.md`).

Ray preloads in every Python worker it starts, also the ones it starts later for the light
actors (limiters, gateways, index servers): those set `COLD` (`COLD_ENV`, their runtime env),
and this module then loads nothing, so that none of them waits seconds for a model client it
never uses.

Third-party modules only: a worker keeps what it preloaded for its life, and this package's own
modules, loaded before a code update on disk, would run stale while `code_identity` (which reads
the files) vouched for the new code.
"""

from __future__ import annotations

import importlib
import os
import sys

#: Ray's setting (read by each node's raylet at `ray start`): modules every new worker imports.
PRELOAD_VARIABLE = "RAY_preload_python_modules"
#: The value that names this module.
PRELOAD = "piserini_ray.warm"
#: Set in the environment of a worker whose actor needs no model client.
COLD = "PISERINI_RAY_COLD"
#: The runtime env of the light actors' workers.
COLD_ENV = {"env_vars": {COLD: "1"}}
#: What the replicas' model client imports that takes seconds (the package's own
#: `LITELLM_LOCAL_MODEL_COST_MAP` is set by `piserini_ray/__init__.py`, imported first):
#: litellm (3-4 s of CPU) and the OpenAI SDK's resources, which it loads on its first call
#: (half a second, in every node's model check).
MODULES = ("litellm", "openai.resources", "orjson")


def preloading() -> bool:
    """Whether Ray is preloading this module now: it starts such a worker with the flag
    `--worker-preload-modules=...,piserini_ray.warm`. Anyone else importing it (a driver, for
    its names; a worker of a Ray without the setting, through the package) loads nothing."""
    flag = "--worker-preload-modules="
    named = (arg.removeprefix(flag).split(",") for arg in sys.argv if arg.startswith(flag))
    return any(PRELOAD in names for names in named)


def load() -> list[str]:
    """Import `MODULES` while Ray preloads this module, in a worker that is not `COLD`; the
    names imported."""
    if not preloading() or os.environ.get(COLD):
        return []
    for name in MODULES:
        importlib.import_module(name)
    return list(MODULES)


load()
