"""Offline provider: loopback servers whose models are local policies, speaking each provider's
wire format (Chat Completions, Anthropic Messages, OpenAI Responses, DeepSeek).

Used by zero-cost rehearsal runs (and by the test suite, through the test kit's emulated
provider: `piserini_ray_testkit`, which adds faults and test hooks through `hooks.Interceptor`);
the framework talks to it through litellm exactly as it talks to a real provider. See
`server.py` for the request pipeline. Its settings (`OfflineConfig`, ...) live in the config
layer (`piserini_ray.config.offline`): configs know no provider implementation.
"""

from piserini_ray.config.offline import (
    BatchConfig,
    LatencyConfig,
    OfflineConfig,
    QuotaConfig,
)
from piserini_ray.offline.bill import Bill, BillLine, RecordedRequest
from piserini_ray.offline.codec import Usage
from piserini_ray.offline.hooks import Interceptor, Ticket
from piserini_ray.offline.judge_policy import exact_match_judge_policy
from piserini_ray.offline.policy import Policy, PolicyReply, PolicyToolCall
from piserini_ray.offline.server import OfflineProvider, default_policies, serve

__all__ = [
    "BatchConfig",
    "Bill",
    "BillLine",
    "Interceptor",
    "LatencyConfig",
    "OfflineConfig",
    "OfflineProvider",
    "Policy",
    "PolicyReply",
    "PolicyToolCall",
    "QuotaConfig",
    "RecordedRequest",
    "Ticket",
    "Usage",
    "default_policies",
    "exact_match_judge_policy",
    "serve",
]
