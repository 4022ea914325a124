"""Checks that stop a run before any work (and any spending) when its config cannot succeed:
an unpriced model, a missing API key variable, missing data files. Each error names the field
and the fix."""

from __future__ import annotations

import os
from collections.abc import Sequence

from piserini_ray.config import ModelConfig, OfflineConfig, RunConfig
from piserini_ray.errors import ConfigError
from piserini_ray.metrics.cost import PricingTable, pricing_for


def preflight_runs(configs: Sequence[RunConfig]) -> list[PricingTable]:
    """Every run of a sweep checked before any of it starts (quotas that runs share agree, and
    `preflight` of each); each run's pricing table. Cheap and import-light: the Ray engine
    makes these checks before it starts Ray, so a config mistake stops at once."""
    from piserini_ray.llm.limiter import check_quotas

    check_quotas(configs)
    tables = []
    for config in configs:
        table = pricing_for(config)
        preflight(config, table)
        tables.append(table)
    return tables


def preflight(config: RunConfig, pricing: PricingTable | None = None) -> None:
    pricing = pricing or pricing_for(config)
    _check_priced("model", config.model, pricing)
    _check_key("model", config.model, config.offline)
    preflight_judge(config, pricing)
    for field in ("queries", "corpus", "qrels_evidence", "qrels_gold"):
        path = getattr(config.benchmark, field)
        if path is not None and not path.exists():
            raise ConfigError(f"benchmark.{field}: {path} does not exist (check the path)")
    if config.slice.ids_file is not None and not config.slice.ids_file.exists():
        raise ConfigError(f"slice.ids_file: {config.slice.ids_file} does not exist")


def preflight_judge(config: RunConfig, pricing: PricingTable | None = None) -> None:
    """The judge's share of the checks: priced, and its key variable set (before judging)."""
    pricing = pricing or pricing_for(config)
    for model in config.judge.models or [config.judge_model()]:
        _check_priced("judge.model", model, pricing)
        _check_key("judge.model", model, config.offline)


#: litellm's providers that sell each tier through the route the client calls.
TIER_PROVIDERS = {"flex": ("openai",), "batch": ("openai", "anthropic")}


def _check_priced(role: str, model: ModelConfig, pricing: PricingTable) -> None:
    name, tier = model.name, model.service_tier
    if model.serve is not None:
        return  # priced by its servers' hours (`serve.price_per_replica_hour`), not tokens
    if pricing.price(name) is None:
        raise ConfigError(
            f"{role} {name!r} is not in the pricing table ({pricing.path}): a run must know "
            "what it costs. Add the model with its input, output and cache_read prices per "
            "million tokens, or set pricing.allow_litellm_prices: true to use litellm's map."
        )
    if tier == "standard":
        return
    from piserini_ray.llm.routes import route_provider

    provider = route_provider(model)
    if provider not in TIER_PROVIDERS[tier]:
        sellers = " and ".join(TIER_PROVIDERS[tier])
        raise ConfigError(
            f"{role}.service_tier: {tier} goes through the {sellers} "
            f"route{'s' if len(TIER_PROVIDERS[tier]) > 1 else ''} only "
            + (
                "(OpenAI's Batch API, Anthropic's Message Batches)"
                if tier == "batch"
                else "(OpenAI's flex processing)"
            )
            + f"; {name!r} goes through litellm's {provider!r} route "
            f"({model.resolved_litellm_model()}). Use service_tier: standard for it"
        )
    if pricing.price(name, tier) is None:
        raise ConfigError(
            f"{role} {name!r} has no {tier} price in the pricing table ({pricing.path}): add "
            f"`tiers: {{{tier}: <share of the standard prices>}}` to its entry (0.5 for "
            "OpenAI's and Anthropic's published batch and flex prices)"
        )


def _check_key(role: str, model: ModelConfig, offline: OfflineConfig) -> None:
    if model.api_key_env is not None and not os.environ.get(model.api_key_env):
        raise ConfigError(
            f"{role}.api_key_env names {model.api_key_env}, which is not set in the environment: "
            f"export {model.api_key_env}=... (the key is read from there, never from files)"
        )
    served = model.serve is not None or offline.serves(model)  # by the run: no key
    if model.api_key_env is None and model.api_base is None and not served:
        from piserini_ray.llm.routes import missing_variables

        lacking = missing_variables(model)
        if lacking is not None:
            missing = ", ".join(lacking) or "the provider's API key"
            raise ConfigError(
                f"{role} {model.name!r} needs {missing} in the environment; export it, or name "
                f"the variable in {role}.api_key_env"
            )
