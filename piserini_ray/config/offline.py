"""Configuration of the offline provider: latency, quotas, prefix caching, model aliases and
its batch queue: what a rehearsal sets.

All models are frozen and reject unknown keys, like the rest of the project's configs, so a typo
in a rehearsal config fails instead of silently doing nothing. Injected faults (seeded rates,
scripted failures, held requests, batch fates) are no run's settings: the tests set them on the
test kit's emulated provider (`piserini_ray_testkit.EmulatedProvider`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from piserini_ray.config.base import StrictModel as _Strict

#: Keys removed from the `offline` section, at the only value a run may still give them: the
#: value every config had (a manifest written before their removal holds them, and loads).
_RETIRED_OFFLINE_KEYS: dict[str, Any] = {
    "faults": {
        "http_500": 0.0,
        "hang": 0.0,
        "empty_reply": 0.0,
        "malformed_arguments": 0.0,
        "unknown_tool": 0.0,
        "missing_fields": 0.0,
    },
    "hang_seconds": 3600.0,
}
_RETIRED_BATCH_KEYS: dict[str, Any] = {"error_rate": 0.0, "expire_rate": 0.0}


def _drop_retired(data: Any, section: str, retired: dict[str, Any]) -> Any:
    """`data` without the retired keys at their old default; a retired key set otherwise is
    refused with what to do instead (configs reject unknown keys anyway: this says why)."""
    if not isinstance(data, dict) or not set(data) & set(retired):
        return data
    kept = dict(data)
    for key, default in retired.items():
        if key not in kept:
            continue
        value = kept.pop(key)
        if isinstance(default, dict) and isinstance(value, dict):
            value = default | value
        if value != default:
            raise ValueError(
                f"{section}.{key} was removed: a run's offline provider injects no faults. "
                "Rehearse without it (delete the key); a test that needs faults, held requests "
                "or batch fates sets them on the test kit's emulated provider "
                "(piserini_ray_testkit.EmulatedProvider) and points the run's model.api_base "
                "at it"
            )
    return kept


class LatencyConfig(_Strict):
    """Delay before each admitted request is answered.

    `none`: no delay. `fixed`: `seconds` every time. `lognormal`: a log-normal draw whose *mean*
    is `seconds` and whose log-space standard deviation is `sigma` (so mu = ln(seconds) -
    sigma²/2), seeded by `OfflineConfig.seed`; `max_seconds` caps the long tail.
    """

    IDENTITY = ("kind", "seconds", "sigma", "max_seconds")
    NOT_IDENTITY = ()

    kind: Literal["none", "fixed", "lognormal"] = "none"
    seconds: float = Field(0.0, ge=0)
    sigma: float = Field(0.5, ge=0)
    max_seconds: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> LatencyConfig:
        if self.kind == "lognormal" and self.seconds <= 0:
            raise ValueError("lognormal latency needs seconds > 0 (it is the mean delay)")
        return self


class QuotaConfig(_Strict):
    """Per-API-key limits over a sliding window (60 s, as providers define per-minute limits).

    A request is admitted when the window holds fewer than `requests_per_minute` requests and
    its tokens (prompt + completion of admitted requests) plus this request's prompt tokens stay
    within `tokens_per_minute`. Rejected (429) requests consume nothing. Every route applies
    them and answers in its provider's format: the window in the body (OpenAI's `type`) and
    the rate-limit headers (`x-ratelimit-*`; Anthropic's `anthropic-ratelimit-*`).
    """

    IDENTITY = ("requests_per_minute", "tokens_per_minute", "window_seconds")
    NOT_IDENTITY = ()

    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    window_seconds: float = Field(60.0, gt=0)


class BatchConfig(_Strict):
    """The batch emulators (OpenAI's Batch API, Anthropic's Message Batches): how long a batch
    queues, and their caps.

    `completion_seconds`: time a batch waits in the queue before its requests run (the
    providers promise 24 hours; most batches end within one). `max_requests` and `max_bytes`:
    lower caps than the providers' published ones (OpenAI 50,000 requests and 200 MB;
    Anthropic 100,000 requests and 256 MB), to rehearse splitting; None keeps the published
    limit.
    """

    IDENTITY = ("completion_seconds", "max_requests", "max_bytes")
    NOT_IDENTITY = ()

    completion_seconds: float = Field(0.0, ge=0)
    max_requests: int | None = Field(None, ge=1)
    max_bytes: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        return _drop_retired(data, "offline.batch", _RETIRED_BATCH_KEYS)


class OfflineConfig(_Strict):
    """Everything the offline provider does besides the policies themselves."""

    IDENTITY = (
        "port",
        "require_key",
        "prefix_caching",
        "latency",
        "quotas",
        "seed",
        "request_log",
        "model_aliases",
    )
    # The batch emulators serve only batch-tier calls, which no run makes yet; counting them
    # would rename every offline run (the default config's hash is pinned).
    NOT_IDENTITY = ("batch",)
    # `faults` and `hang_seconds` were identity fields until the fault injection moved to the
    # test kit; every run had them at these values (no fault can be configured any more), and
    # they stay in the identity as constants so that existing run names are kept.
    RETIRED_IDENTITY = _RETIRED_OFFLINE_KEYS

    port: int = Field(0, ge=0, le=65535)  # 0: the OS picks a free port
    require_key: bool = False
    prefix_caching: bool = True
    latency: LatencyConfig = LatencyConfig()
    quotas: QuotaConfig = QuotaConfig()
    seed: int = 0
    #: Recent requests that `OfflineProvider.requests` keeps, conversations included; older ones
    #: are dropped, so a long rehearsal's memory stays flat.
    request_log: int = Field(1000, ge=1)
    #: Models served under other names, e.g. `{claude-haiku-4-5: offline/heuristic}`: a
    #: provider's native route (Anthropic's `/v1/messages`) rehearsed with its own model names.
    model_aliases: dict[str, str] = Field(default_factory=dict)
    #: The batch emulators (`/v1/batches`, `/v1/messages/batches`).
    batch: BatchConfig = BatchConfig()

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        return _drop_retired(data, "offline", _RETIRED_OFFLINE_KEYS)

    def serves(self, model: Any) -> bool:
        """Whether the run-started provider of these settings serves `model` (a ModelConfig):
        an offline model, or a provider's model listed in `model_aliases` by its name or by
        its name on its route (`claude-haiku-4-5` of `anthropic/claude-haiku-4-5`: a rehearsal
        under real names and prices), either without an `api_base` of its own."""
        on_route = model.resolved_litellm_model().split("/", 1)[-1]
        return model.api_base is None and (
            model.is_offline or model.name in self.model_aliases or on_route in self.model_aliases
        )
