"""Offline provider: an OpenAI-compatible server on loopback whose models are local policies.

Used by the test suite and by zero-cost rehearsal runs; the framework talks to it through litellm
exactly as it talks to a real provider. See `server.py` for the request pipeline.
"""

from piserini_ray.offline.config import (
    FaultRates,
    LatencyConfig,
    OfflineConfig,
    QuotaConfig,
    Scripted,
)
from piserini_ray.offline.judge_policy import exact_match_judge_policy
from piserini_ray.offline.policy import Policy, PolicyReply, PolicyToolCall
from piserini_ray.offline.server import (
    OfflineProvider,
    RecordedRequest,
    Usage,
    default_policies,
    serve,
)

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
