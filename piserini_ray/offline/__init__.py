"""Offline provider: an OpenAI-compatible server on loopback whose models are local policies.

Used by the test suite and by zero-cost rehearsal runs; the framework talks to it through litellm
exactly as it talks to a real provider. See `server.py` for the request pipeline.
"""

from typing import TYPE_CHECKING

from piserini_ray.offline.config import (
    FaultRates,
    LatencyConfig,
    OfflineConfig,
    QuotaConfig,
    Scripted,
)
from piserini_ray.offline.policy import Policy, PolicyReply, PolicyToolCall

if TYPE_CHECKING:  # what `__getattr__` below provides, for type checkers
    from piserini_ray.offline.judge_policy import exact_match_judge_policy
    from piserini_ray.offline.server import (
        OfflineProvider,
        RecordedRequest,
        Usage,
        default_policies,
        serve,
    )

# The server pulls in aiohttp and the tokenizer; every config import reaches this package (for
# `OfflineConfig`), so the server's names load on first use only.
_LAZY = {
    "OfflineProvider": "piserini_ray.offline.server",
    "RecordedRequest": "piserini_ray.offline.server",
    "Usage": "piserini_ray.offline.server",
    "default_policies": "piserini_ray.offline.server",
    "serve": "piserini_ray.offline.server",
    "exact_match_judge_policy": "piserini_ray.offline.judge_policy",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FaultRates",
    "LatencyConfig",
    "OfflineConfig",
    "OfflineProvider",
    "Policy",
    "PolicyReply",
    "PolicyToolCall",
    "QuotaConfig",
    "RecordedRequest",
    "Scripted",
    "Usage",
    "default_policies",
    "exact_match_judge_policy",
    "serve",
]
