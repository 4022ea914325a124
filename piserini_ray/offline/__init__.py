"""Offline provider: loopback servers whose models are local policies, speaking each provider's
wire format (Chat Completions, Anthropic Messages, OpenAI Responses, DeepSeek).

Used by the test suite and by zero-cost rehearsal runs; the framework talks to it through litellm
exactly as it talks to a real provider. See `server.py` for the request pipeline. Its settings
(`OfflineConfig`, ...) live in the config layer (`piserini_ray.config.offline`): configs know no
provider implementation.
"""

from piserini_ray.config.offline import (
    BatchConfig,
    FaultRates,
    LatencyConfig,
    OfflineConfig,
    QuotaConfig,
    Scripted,
)
from piserini_ray.offline.judge_policy import exact_match_judge_policy
from piserini_ray.offline.policy import Policy, PolicyReply, PolicyToolCall
from piserini_ray.offline.server import (
    Bill,
    BillLine,
    OfflineProvider,
    RecordedRequest,
    Usage,
    default_policies,
    serve,
)

__all__ = [
    "BatchConfig",
    "Bill",
    "BillLine",
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
