"""`llm/routes.py`: the route of a model, answered without litellm's import where the route
names its provider, and always litellm's own answer."""

from __future__ import annotations

import litellm
import pytest
from helpers import fresh_python

from piserini_ray.config import ModelConfig
from piserini_ray.llm.routes import route_provider

ROUTES = [
    "openai/gpt-5.4-mini",
    "openai/gpt-4o",
    "openai/a-model-litellm-has-never-heard-of",
    "openai/org/model",
    "anthropic/claude-opus-4-5",
    "anthropic/claude-sonnet-4-5-20250929",
    "anthropic/an-unknown-claude",
    "deepseek/deepseek-chat",
    "gpt-4o",
    "claude-opus-4-5",
    "no-such-provider/model",
]


@pytest.mark.parametrize("route", ROUTES)
def test_the_route_is_litellms(route: str) -> None:
    try:
        expected = str(litellm.get_llm_provider(route)[1])
    except Exception:
        expected = "unknown"
    assert route_provider(ModelConfig(name="m", litellm_model=route)) == expected


def test_a_forced_proxy_is_asked_of_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USE_LITELLM_PROXY", "True")
    route = "openai/gpt-5.4-mini"
    expected = str(litellm.get_llm_provider(route)[1])
    assert expected != "openai"  # litellm sends every call to its proxy then
    assert route_provider(ModelConfig(name="m", litellm_model=route)) == expected


def test_a_route_that_names_its_provider_loads_no_litellm() -> None:
    script = (
        "import sys\n"
        "from piserini_ray.config import ModelConfig\n"
        "from piserini_ray.llm.routes import route_provider\n"
        "print(route_provider(ModelConfig(name='m', litellm_model='anthropic/claude-opus-4-5')),"
        " 'litellm' in sys.modules)\n"
    )
    assert fresh_python(script).split() == ["anthropic", "False"]
