"""Which litellm provider route a model goes through (`openai`, `anthropic`, `deepseek`, ...).

The driver asks this of every model a run serves on its loopback (`endpoints.py`) and of every
model at a half-price tier (`preflight.py`). A route written with one of `PREFIXED` in front
(`openai/gpt-5.4-mini`) is litellm's that prefix (`get_llm_provider` takes a prefix of its
provider list as the provider), answered here without importing litellm: its import is seconds
of CPU that a run's start-up would spend beside its replicas' own. Any other route asks litellm
(the tests hold the shortcut to litellm's answers).
"""

from __future__ import annotations

import os

from piserini_ray.config import ModelConfig

#: Route prefixes litellm takes as the provider itself, unless a proxy is forced on every call
#: (`USE_LITELLM_PROXY`, litellm's `should_use_litellm_proxy_by_default`).
PREFIXED = frozenset({"openai", "anthropic"})


def route_provider(model: ModelConfig) -> str:
    """litellm's provider of the model's route; an offline model goes through the OpenAI
    route to the loopback provider; "unknown" for a route litellm does not know (its own call
    then says what is wrong)."""
    route = model.resolved_litellm_model()
    prefix, slash, rest = route.partition("/")
    if slash and rest and prefix in PREFIXED and not os.environ.get("USE_LITELLM_PROXY"):
        return prefix
    import litellm

    try:
        return str(litellm.get_llm_provider(route)[1])
    except Exception:
        return "unknown"
