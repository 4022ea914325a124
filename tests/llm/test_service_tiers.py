"""Service tiers (issue 22): `model.service_tier: flex` sends OpenAI's `service_tier: flex`, is
billed at the flex tier by the emulator and priced at the table's flex share; flex's 429
"resource unavailable" is waited out without cutting concurrency (a quota 429 cuts it); a tier
a route or the table does not sell, and `batch` with a wall-clock budget, are config errors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from piserini_ray.agent.prompt import SYSTEM_PROMPT, question_message
from piserini_ray.config import ModelConfig, RateLimitConfig, RetryConfig, RunConfig, load_config
from piserini_ray.errors import ConfigError
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.limiter import LocalLimiter, RateLimiter
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig
from piserini_ray.preflight import preflight
from piserini_ray.records import Usage
from piserini_ray.tools import tool_schemas
from piserini_ray_testkit import EmulatedProvider, Scripted

MESSAGES = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": question_message("Who founded the Journal of Psychotherapy?")},
]
FAST = RetryConfig(backoff_base=0.01, backoff_cap=0.05, max_attempts=4)


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatedProvider]:
    monkeypatch.setenv("PISERINI_TEST_TIER_KEY", "sk-test-tiers")
    config = OfflineConfig(model_aliases={"gpt-5": "offline/heuristic"})
    with EmulatedProvider(config) as p:
        yield p


def _model(provider: EmulatedProvider, tier: str) -> ModelConfig:
    return ModelConfig(
        name="gpt-5.4-mini",
        litellm_model="openai/gpt-5",  # Chat Completions (gpt-5.4+ would take the Responses API)
        api_base=provider.base_url,
        api_key_env="PISERINI_TEST_TIER_KEY",
        service_tier=tier,
    )


def test_flex_is_sent_billed_at_the_flex_tier_and_priced_at_half(provider) -> None:
    async def calls() -> list[Usage]:
        used = []
        for tier in ("standard", "flex"):
            client = LLMClient(_model(provider, tier), FAST, provider.base_url)
            used.append((await client.complete(MESSAGES, tool_schemas())).usage)
        return used

    standard, flex = asyncio.run(calls())
    # The same request and reply: only the price differs (the second may hit the cache).
    assert (standard.input_tokens, standard.output_tokens) == (
        flex.input_tokens,
        flex.output_tokens,
    )
    served = provider.requests
    assert [r.service_tier for r in served] == ["standard", "flex"]
    assert set(provider.bill) == {("standard", "gpt-5"), ("flex", "gpt-5")}
    assert provider.bill[("flex", "gpt-5")].requests == 1
    table = load_pricing()
    price, flex_price = table.price("gpt-5.4-mini"), table.price("gpt-5.4-mini", "flex")
    assert price is not None and flex_price is not None
    assert price.cost(flex) > 0
    assert flex_price.cost(flex) == pytest.approx(0.5 * price.cost(flex))
    model = _model(provider, "flex")
    assert table.model_price(model) == flex_price
    assert model.call_timeout == 900.0  # OpenAI's advice for flex: wait up to 15 minutes


def test_flex_resource_unavailable_is_a_cooldown_not_a_concurrency_cut(provider) -> None:
    """The flex tier's 429 says the provider has no capacity: the call backs off and succeeds,
    and the limiter keeps its concurrency and holds no one back (no quota window is full). A
    429 that names no window (the control) cuts the concurrency."""
    limiter = RateLimiter(RateLimitConfig(initial_concurrency=8, max_concurrency=8))

    async def call() -> int:
        client = LLMClient(_model(provider, "flex"), FAST, provider.base_url, LocalLimiter(limiter))
        provider.script(Scripted(kind="resource_unavailable"))
        return (await client.complete(MESSAGES)).attempts

    assert asyncio.run(call()) == 2
    assert limiter.limit == 8 and limiter.rate_limited == 1
    assert limiter.stats().cooldown_remaining == 0
    refused = [r for r in provider.requests if r.fault == "resource_unavailable"]
    assert [r.status for r in refused] == [429] and refused[0].usage is None  # not billed
    limiter.release("", "rate_limit")
    assert limiter.limit < 8


def test_a_flex_429_body_is_what_the_emulator_sends(provider) -> None:
    import httpx

    provider.script(Scripted(kind="resource_unavailable"))
    response = httpx.post(
        f"{provider.base_url}/chat/completions",
        json={"model": "gpt-5", "messages": MESSAGES, "service_tier": "flex"},
        headers={"Authorization": "Bearer k"},
    )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "resource_unavailable"
    assert not any(h.startswith("x-ratelimit") for h in response.headers)


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        (
            {"name": "claude-haiku-4.5", "service_tier": "flex", "api_key_env": "HOME"},
            "service_tier: flex goes through the openai route only",
        ),
        (
            {
                "name": "deepseek-v4-flash",
                "litellm_model": "deepseek/deepseek-v4-flash",
                "service_tier": "flex",
                "api_key_env": "HOME",
            },
            "'deepseek' route",
        ),
    ],
)
def test_a_tier_the_route_does_not_sell_is_a_config_error(model: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match="service_tier") as error:
        preflight(load_config(None, {"model": model}))
    assert needle in str(error.value)


def test_a_tier_the_table_does_not_price_is_a_config_error(tmp_path) -> None:
    table = tmp_path / "pricing.yaml"
    table.write_text(
        "models:\n  gpt-5: {input: 1.25, output: 10, cache_read: 0.125}\n"
        "  offline/exact-match-judge: {input: 0, output: 0, cache_read: 0}\n"
    )
    config = load_config(
        None,
        {"model": {"name": "gpt-5", "service_tier": "flex", "api_key_env": "HOME"},
         "pricing.table": str(table)},
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"no flex price .*tiers: \{flex"):
        preflight(config)


def test_batch_with_a_wall_clock_budget_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"agent\.termination: iterations"):
        RunConfig.model_validate({"model": {"name": "gpt-5", "service_tier": "batch"}})
    config = RunConfig.model_validate(
        {"model": {"name": "gpt-5", "service_tier": "batch", "api_key_env": "HOME"},
         "agent": {"termination": "iterations"}}
    )  # fmt: skip
    preflight(config)  # with the turns counted, batch is a valid tier for the agent


def test_the_standard_tier_keeps_every_runs_name_and_other_tiers_are_runs_of_their_own() -> None:
    base = {"name": "gpt-5", "call_timeout": 900.0}
    names = {
        tier: RunConfig.model_validate({"model": base | {"service_tier": tier}}).config_hash()
        for tier in ("standard", "flex")
    }
    assert names["standard"] == RunConfig.model_validate({"model": base}).config_hash()
    assert names["flex"] != names["standard"]
