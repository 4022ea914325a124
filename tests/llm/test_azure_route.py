"""An Azure-routed model (`azure/<deployment>`): its calls read three variables, not a guessed
`AZURE_API_KEY` alone (`routes.route_facts`, from litellm's own `validate_environment`), the
driver hands all three to a replica, and a client whose process has none of them calls the
endpoint with what it was handed. Against an Azure front on loopback, as strict as Azure
OpenAI on what it checks (the `api-key` header, the `api-version` query, the deployment in the
path or, on the Responses API, in the body), that passes each call on to the offline
provider's chat or Responses route."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from azure_front import AZURE, DEPLOYMENT, KEY, VERSION, AzureFront
from pydantic import SecretStr

from piserini_ray.config import ModelConfig, RetryConfig
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.routes import route_facts
from piserini_ray.llm.scrubber import driver_keys, scrub
from piserini_ray.offline import OfflineConfig, OfflineProvider


@pytest.fixture
def front() -> Iterator[AzureFront]:
    served = OfflineConfig(model_aliases={DEPLOYMENT: "offline/heuristic"})
    with OfflineProvider(served) as provider, AzureFront(provider.base_url) as azure:
        yield azure


MODEL = ModelConfig(name=DEPLOYMENT, litellm_model=f"azure/{DEPLOYMENT}")
MESSAGES = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Which city is the capital of France?"},
]


def test_the_route_reads_litellms_three_variables_and_the_driver_hands_all_of_them(
    front: AzureFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = route_facts(MODEL)
    assert facts.provider == "azure" and facts.variables == AZURE
    assert [v for v in AZURE if facts.secret(v)] == ["AZURE_API_KEY"]
    assert [facts.parameter(v) for v in AZURE] == ["api_base", "api_version", "api_key"]
    for name, value in zip(AZURE, (front.base, VERSION, KEY), strict=True):
        monkeypatch.setenv(name, value)
    handed = driver_keys([MODEL])
    assert {k: v.get_secret_value() for k, v in handed.items()} == dict(
        zip(AZURE, (front.base, VERSION, KEY), strict=True)
    )
    assert scrub(f"key {KEY}") == "key ***"  # the secret one is held for the scrubber


def test_a_client_with_none_of_the_variables_calls_with_what_it_was_handed(
    front: AzureFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in AZURE:  # a bare node: nothing of the user's environment
        monkeypatch.delenv(name, raising=False)
    handed = dict(zip(AZURE, map(SecretStr, (front.base, VERSION, KEY)), strict=True))
    client = LLMClient(MODEL, RetryConfig(max_attempts=1), keys=handed)
    completion = asyncio.run(client.complete(MESSAGES))
    assert completion.content or completion.tool_calls
    assert completion.usage.input_tokens > 0
    assert front.seen and all(s["api-key"] == KEY for s in front.seen)
    assert front.seen[-1]["path"] == f"/openai/deployments/{DEPLOYMENT}/chat/completions"


def test_the_front_refuses_what_azure_refuses(front: AzureFront) -> None:
    def post(path: str, key: str) -> tuple[int, str]:
        request = urllib.request.Request(
            front.base + path, data=b"{}", headers={"api-key": key}, method="POST"
        )
        try:
            with urllib.request.urlopen(request) as answer:
                return answer.status, ""
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]["code"]

    good = f"/openai/deployments/{DEPLOYMENT}/chat/completions"
    assert post(f"{good}?api-version={VERSION}", "wrong") == (401, "401")
    assert post(good, KEY) == (404, "404")
    assert post(f"/openai/deployments/other/chat/completions?api-version={VERSION}", KEY) == (
        404,
        "DeploymentNotFound",
    )
