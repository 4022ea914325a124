"""Check before you spend: one tiny request to each distinct model of a run (agent and judge)
through its real route, so that a wrong key, model name, route or endpoint stops the run in
seconds with the provider's own message, not after every query has failed on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from piserini_ray.config import ModelConfig, OfflineConfig, RetryConfig, RunConfig
from piserini_ray.errors import ConfigError

#: The API base of a model under a run's offline settings (`endpoints.ModelEndpoints.api_base`).
Endpoint = Callable[[ModelConfig, OfflineConfig], str | None]

#: Seconds the check waits for a reply: a live endpoint answers a tiny prompt well within it.
CHECK_TIMEOUT = 8.0
PROMPT = [{"role": "user", "content": "Reply with the single word OK."}]


def models_of(
    configs: Iterable[RunConfig], agents: bool = True
) -> list[tuple[ModelConfig, RunConfig]]:
    """Each distinct (route, endpoint, key variable) once, agent and judge models alike
    (`agents=False`: the judges only)."""
    seen: dict[tuple[str, str | None, str | None], tuple[ModelConfig, RunConfig]] = {}
    for config in configs:
        for model in (config.model, config.judge_model()) if agents else (config.judge_model(),):
            key = (model.resolved_litellm_model(), model.api_base, model.api_key_env)
            seen.setdefault(key, (model, config))
    return list(seen.values())


def probe_model(model: ModelConfig) -> ModelConfig:
    """The model as the check calls it: its own settings (thinking, output cap, ...), so the
    check is refused exactly where the run's calls would be; only the wait is shorter."""
    return model.model_copy(update={"call_timeout": min(CHECK_TIMEOUT, model.call_timeout)})


def check_models(
    configs: Iterable[RunConfig],
    endpoint: Endpoint,
    log: Callable[[str], None],
    include_offline: bool = False,
    agents: bool = True,
) -> None:
    """Raise `ConfigError` naming every model whose tiny request failed. Offline models are
    skipped unless asked (they run on loopback, free; `run --check` includes them); the agent
    models too with `agents=False` (an engine that checks them where its queries run)."""
    checked = [
        (model, config)
        for model, config in models_of(configs, agents)
        if (include_offline or not model.is_offline) and model.serve is None
    ]
    # A model the run serves is checked where and when its servers start (their health and
    # model list, `serving/process.py`): a check here would start one on this machine.
    if not checked:
        return  # and litellm, seconds of imports, is not loaded for nothing
    from piserini_ray.llm.client_builder import build_client
    from piserini_ray.llm.failures import RetryError

    failures = []
    for model, config in checked:
        probe = probe_model(model)
        try:
            api_base = endpoint(probe, config.offline)
            client = build_client(
                probe, RetryConfig(max_attempts=1), config.offline, api_base=api_base, limiters=None
            )
            asyncio.run(client.complete(PROMPT))
        except RetryError as error:
            failures.append(
                f"{model.name} (route {model.resolved_litellm_model()}"
                f"{', ' + model.api_base if model.api_base else ''}): {error}"
            )
            continue
        log(f"checked {model.name}: it answers through {model.resolved_litellm_model()}")
    if failures:
        raise ConfigError(
            "a model did not answer a one-word check, so nothing was run (fix the key, the "
            "model name or the endpoint):\n  " + "\n  ".join(failures)
        )
