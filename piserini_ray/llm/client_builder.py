"""The one place a model becomes an LLM client: its endpoint, its key and the limiter of its
quota key. The agent loop (through either engine), the judge, `ask` and the model check all
build their clients here, so a model is called the same way wherever it is called from.

It knows no engine: the caller hands it the endpoint (`endpoints.ModelEndpoints` decides it)
and a limiter registry (`llm.limiter.LOCAL_LIMITERS` in this process, the Ray runtime's
cluster-wide one on Ray), or none for a call that no quota may delay (the one-word check).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import SecretStr

from piserini_ray.config import ModelConfig, OfflineConfig, RetryConfig
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.limiter import LimiterRegistry


def build_client(
    model: ModelConfig,
    retry: RetryConfig,
    offline: OfflineConfig,
    *,
    api_base: str | None,
    limiters: LimiterRegistry | None,
    keys: Mapping[str, SecretStr] | None = None,
    seed: int | None = None,
) -> LLMClient:
    """An LLM client for `model` at `api_base` (None: the provider's default endpoint), under
    the limiter that `limiters` holds for the model's quota key (`offline`: the settings that
    name an offline model's account), with the key values the driver handed over (`keys`; else
    this process's environment); `seed`: the `seed` request parameter, where the route takes
    one (an epoch's, `EpochsConfig.request_seed`)."""
    limiter = limiters.limiter(model, offline) if limiters is not None else None
    return LLMClient(model, retry, api_base=api_base, limiter=limiter, keys=keys, request_seed=seed)
