"""The `model` and `retry` sections: one model behind litellm (its route, key name, tier and
rate limits) and the one retry policy of every LLM call."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from piserini_ray.config.base import StrictModel
from piserini_ray.config.secret_rules import ROUTE_FIX, key_shaped, route_setting
from piserini_ray.config.serving import ROUTES, ServeConfig

OFFLINE_PREFIX = "offline/"


class RateLimitConfig(StrictModel):
    """Cluster-wide admission control for one model (see `piserini_ray/llm/limiter.py`)."""

    # Not identity: how fast calls are sent, not what they answer.
    IDENTITY = ()
    NOT_IDENTITY = (
        "requests_per_minute",
        "tokens_per_minute",
        "initial_concurrency",
        "min_concurrency",
        "max_concurrency",
        "decrease_factor",
        "clean_period",
        "window_seconds",
        "window_margin",
        "output_tokens_guess",
        "estimate_margin",
    )

    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    #: Requests in flight at once: starts at `initial_concurrency` (None: `max_concurrency`, so
    #: nothing is held back before the provider pushes back); a 429 sets it to
    #: `decrease_factor` x the calls in flight then (never below `min_concurrency`), and it grows
    #: by one after each `clean_period` seconds without one.
    initial_concurrency: int | None = Field(None, ge=1)
    min_concurrency: int = Field(1, ge=1)
    max_concurrency: int = Field(256, ge=1)
    decrease_factor: float = Field(0.5, gt=0, lt=1)
    clean_period: float = Field(10.0, gt=0)
    #: Seconds of the quota window; a margin is added so arrival jitter cannot overfill it.
    window_seconds: float = Field(60.0, gt=0)
    window_margin: float = Field(1.0, ge=0)
    #: Completion tokens a call reserves against `tokens_per_minute` before the limiter has
    #: learned the model's mean from replies (`model.max_output_tokens`, when set, is reserved
    #: instead: a bound, not a guess).
    output_tokens_guess: int = Field(500, ge=0)
    #: Reservations from learned estimates (the prompt's scale, the completion's mean) are
    #: raised by this fraction: estimates err both ways, and a call in flight that uses more
    #: than it reserved is what tips a full window over. Costs almost nothing: only calls in
    #: flight hold reservations, a returned call counts with the provider's figures.
    estimate_margin: float = Field(0.1, ge=0, le=1)


#: The call time-out of a flex model unless set (OpenAI's advice: 15 minutes).
FLEX_CALL_TIMEOUT = 900.0


class ModelConfig(StrictModel):
    """One model behind litellm. Key *names* live here; key values only in the environment."""

    IDENTITY = (
        "name",
        "litellm_model",
        "api_base",
        "api_key_env",
        "temperature",
        "max_output_tokens",
        "reasoning_effort",
        "call_timeout",
        "extra",
        "service_tier",
        "serve",
    )
    NOT_IDENTITY = ("prompt_caching", "rate_limit")
    # The standard tier is how every run was named before tiers existed; a model the user
    # serves (no `serve`) likewise.
    OMITTED_AT_DEFAULT = ("service_tier", "serve")

    name: str = "offline/heuristic"
    #: What litellm is called with. Default: `openai/<name>` for offline models (the loopback
    #: provider speaks the OpenAI protocol), else `name` itself.
    litellm_model: str | None = None
    #: None for an offline model means: the offline provider this process starts on loopback.
    api_base: str | None = None
    #: Name of the environment variable that holds the API key (never the key itself).
    api_key_env: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    #: Seconds one HTTP call may take before it counts as a transient failure.
    call_timeout: float = Field(180.0, gt=0)
    #: `auto`: mark cache breakpoints where the provider caches only what is marked (Anthropic:
    #: the system prompt and the moving tail of the conversation); providers that cache on
    #: their own (OpenAI, DeepSeek) get nothing. `off`: never mark.
    prompt_caching: Literal["auto", "off"] = "auto"
    #: Extra keyword arguments passed to litellm as they are (e.g. provider-specific options).
    extra: dict[str, Any] = Field(default_factory=dict)
    rate_limit: RateLimitConfig = RateLimitConfig()
    #: What the provider bills and how fast it answers: `standard`; `flex` (OpenAI's
    #: `service_tier: flex`, batch prices, slower answers and 429 "resource unavailable" when
    #: it has no capacity: a call time-out of 900 s unless `call_timeout` is set); `batch`
    #: (OpenAI's Batch API, Anthropic's Message Batches: half price, answers within hours).
    #: Part of the run's identity (a run is priced at one tier); `standard` names it as before.
    service_tier: Literal["standard", "flex", "batch"] = "standard"
    #: Served by the run itself on its nodes (`config/serving.py`): the engine, the weights,
    #: servers and their resources, the price per server-hour. Its calls go to those servers.
    serve: ServeConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _flex_waits_longer(cls, data: Any) -> Any:
        # OpenAI's flex guide: raise the time-out to 15 minutes, flex requests queue.
        if isinstance(data, dict) and data.get("service_tier") == "flex":
            data = {"call_timeout": FLEX_CALL_TIMEOUT, **data}
        return data

    @property
    def is_offline(self) -> bool:
        return self.name.startswith(OFFLINE_PREFIX)

    def resolved_litellm_model(self) -> str:
        if self.litellm_model:
            return self.litellm_model
        if self.serve is not None:
            return f"{ROUTES[self.serve.engine]}/{self.name}"
        return f"openai/{self.name}" if self.is_offline else self.name

    @model_validator(mode="after")
    def _served_here_or_there(self) -> ModelConfig:
        if self.serve is not None and (self.api_base is not None or self.is_offline):
            raise ValueError(
                f"model {self.name!r} has `serve` and "
                + ("an api_base" if self.api_base is not None else "an offline name")
                + ": a served model is called at its own servers; drop one of them"
            )
        return self

    @model_validator(mode="after")
    def _key_name_not_value(self) -> ModelConfig:
        if self.api_key_env is not None and not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env
        ):
            raise ValueError(
                "model.api_key_env must be the NAME of an environment variable (e.g. "
                "OPENAI_API_KEY), not a key value; keys are never written into configs"
            )
        for where, name, value in _free_form(self):
            if problem := key_shaped(name, value):
                raise ValueError(
                    f"{where} {problem}: keys are never written into configs (the run's "
                    "manifest would keep it). Export it in an environment variable and name "
                    "that variable in model.api_key_env"
                )
        for name in self.extra:
            if route_setting(str(name)):
                raise ValueError(
                    f"model.extra.{name} would change where or how the model's requests are "
                    f"sent or authenticated: {ROUTE_FIX}"
                )
        return self


def _free_form(model: ModelConfig) -> list[tuple[str, str, Any]]:
    """Every free-form value of a model block as (where, its own name, value): `extra`
    (nested), and `api_base` with its query parameters and user info."""
    found: list[tuple[str, str, Any]] = []

    def walk(path: str, name: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{path}.{key}", str(key), item)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(f"{path}[{i}]", name, item)
        else:
            found.append((path, name, value))

    walk("model.extra", "extra", model.extra)
    if model.api_base:
        from urllib.parse import parse_qsl, urlsplit

        parts = urlsplit(model.api_base)
        if parts.password:
            found.append(("model.api_base's user info", "password", parts.password))
        query = parse_qsl(parts.query)
        found += [(f"model.api_base's query parameter {k!r}", k, v) for k, v in query]
        found.append(("model.api_base", "api_base", model.api_base))
    return found


class RetryConfig(StrictModel):
    """One classified retry policy for every LLM call (see `piserini_ray/llm/retry.py`)."""

    IDENTITY = ("max_attempts", "max_elapsed", "backoff_base", "backoff_cap", "max_retry_after")
    NOT_IDENTITY = ()

    max_attempts: int = Field(8, ge=1)
    max_elapsed: float = Field(600.0, gt=0)
    backoff_base: float = Field(1.0, gt=0)
    backoff_cap: float = Field(60.0, gt=0)
    #: A Retry-After longer than this is treated as a failure, not waited for.
    max_retry_after: float = Field(300.0, gt=0)
