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


@pytest.mark.parametrize("route", ["openai/gpt-5.4-mini", "anthropic/claude-opus-4-5"])
def test_the_variables_of_a_route_that_names_its_provider_are_litellms(route: str) -> None:
    from piserini_ray.llm.routes import _litellm_variables, route_facts

    facts = route_facts(ModelConfig(name="m", litellm_model=route))
    assert facts.variables == _litellm_variables(route) != ()


def test_a_route_the_shortcut_answers_loads_no_litellm_for_its_variables() -> None:
    script = (
        "import sys\n"
        "from piserini_ray.config import ModelConfig\n"
        "from piserini_ray.llm.routes import route_facts\n"
        "facts = route_facts(ModelConfig(name='m', litellm_model='openai/gpt-5.4-mini'))\n"
        "print(*facts.variables, 'litellm' in sys.modules)\n"
    )
    assert fresh_python(script).split() == ["OPENAI_API_KEY", "False"]


def test_the_aws_variables_are_those_litellms_aws_routes_read() -> None:
    """`AWS_VARIABLES`: each one is the fallback of litellm's `aws_*` parameter of the same
    name (its credentials step), so that a new litellm that drops or renames one shows here."""
    import inspect

    from litellm.llms.bedrock.base_aws_llm import BaseAWSLLM

    from piserini_ray.llm.routes import AWS_VARIABLES, BEDROCK_VARIABLES, route_facts

    source = inspect.getsource(BaseAWSLLM.get_credentials)
    for name in AWS_VARIABLES:
        assert f'({name.lower()}, "{name}")' in source, name
    endpoint = inspect.getsource(BaseAWSLLM.get_runtime_endpoint)
    for name in BEDROCK_VARIABLES:
        assert f'get_secret("{name}")' in endpoint and name.lower() in endpoint, name
    facts = route_facts(ModelConfig(name="m", litellm_model="bedrock/anthropic.claude-v2"))
    everything = AWS_VARIABLES + BEDROCK_VARIABLES
    assert facts.variables == everything
    assert facts.key_variables == ()  # Bedrock's credentials go as their own parameters
    assert [facts.parameter(v) for v in everything] == [v.lower() for v in everything]
    assert [v for v in everything if not facts.secret(v)] == [
        "AWS_REGION_NAME",
        "AWS_BEDROCK_RUNTIME_ENDPOINT",
    ]
    sagemaker = route_facts(ModelConfig(name="m", litellm_model="sagemaker/an-endpoint"))
    assert sagemaker.variables == AWS_VARIABLES
