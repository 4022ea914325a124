"""Configuration: pydantic models of every knob of a run, validated once, and YAML loading.

Every knob of a run lives here, validated once, so that the rest of the code can trust its
inputs. Unknown keys are rejected: a typo in a YAML file must not silently fall back to a default.

One module per concern; every name is re-exported here (`from piserini_ray.config import X`):

- `base`: `StrictModel` (frozen, unknown keys refused, each field's part in the identity
  declared), `identity_data`, `default_home`.
- `benchmark`: the `benchmark` and `slice` sections.
- `retrieval`: the `retrieval` section (BM25 and its presets, dense, hybrid, rerank).
- `agent`: the `agent` and `tools` sections.
- `model`: the `model` (and its `rate_limit`) and `retry` sections.
- `offline`: the `offline` section (the loopback provider's latency, quotas, aliases, batches).
- `runtime`: the `runtime` section (where and how wide a run executes).
- `judging`: the `judge` and `pricing` sections.
- `run`: `RunConfig`, the `run` (epochs) section and the run's identity (`config_hash`).
- `loading`: `read_yaml`, `load_config`.
- `hashing`: files by content (`file_identity`, `sha256_of`, `stamp`).
- `secrets`: what a key looks like, and which settings route a model's requests.
"""

from __future__ import annotations

from piserini_ray.config.agent import AgentConfig, ToolsConfig
from piserini_ray.config.base import StrictModel, default_home, identity_data
from piserini_ray.config.benchmark import BenchmarkConfig, SliceConfig
from piserini_ray.config.hashing import file_identity, sha256_of, stamp
from piserini_ray.config.judging import DEFAULT_JUDGE, OFFLINE_JUDGE, JudgeConfig, PricingConfig
from piserini_ray.config.loading import load_config, read_yaml
from piserini_ray.config.model import (
    FLEX_CALL_TIMEOUT,
    OFFLINE_PREFIX,
    ModelConfig,
    RateLimitConfig,
    RetryConfig,
)
from piserini_ray.config.offline import OfflineConfig
from piserini_ray.config.retrieval import (
    BACKENDS,
    BM25_PRESETS,
    Backend,
    BM25Params,
    DenseConfig,
    HybridConfig,
    RerankConfig,
    RetrievalConfig,
)
from piserini_ray.config.run import EpochsConfig, RunConfig
from piserini_ray.config.runtime import RuntimeConfig, TurnBatchConfig

__all__ = [
    "BACKENDS",
    "BM25_PRESETS",
    "DEFAULT_JUDGE",
    "FLEX_CALL_TIMEOUT",
    "OFFLINE_JUDGE",
    "OFFLINE_PREFIX",
    "AgentConfig",
    "BM25Params",
    "Backend",
    "BenchmarkConfig",
    "DenseConfig",
    "EpochsConfig",
    "HybridConfig",
    "JudgeConfig",
    "ModelConfig",
    "OfflineConfig",
    "PricingConfig",
    "RateLimitConfig",
    "RerankConfig",
    "RetrievalConfig",
    "RetryConfig",
    "RunConfig",
    "RuntimeConfig",
    "SliceConfig",
    "StrictModel",
    "ToolsConfig",
    "TurnBatchConfig",
    "default_home",
    "file_identity",
    "identity_data",
    "load_config",
    "read_yaml",
    "sha256_of",
    "stamp",
]
