"""A Bedrock-routed model (`bedrock/<model id>`, Converse): its calls read AWS credentials, a
region and (here) a runtime endpoint, not an API key (`routes.route_facts`); the driver hands
them all to a replica, and a client whose process has none of them signs its requests with
what it was handed. Against a Bedrock front on loopback that checks every SigV4 signature as
Bedrock does, and answers through the offline provider (tests/bedrock_front.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from bedrock_front import (
    ACCESS_KEY_ID,
    CREDENTIALS,
    MODEL_ID,
    REGION,
    SECRET_ACCESS_KEY,
    BedrockFront,
)
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from pydantic import SecretStr

from piserini_ray.config import ModelConfig, RetryConfig
from piserini_ray.llm.client import LLMClient
from piserini_ray.llm.routes import route_facts
from piserini_ray.llm.scrubber import driver_keys, scrub
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.tools.schemas import tool_schemas

MODEL = ModelConfig(name="claude-haiku-4.5", litellm_model=f"bedrock/{MODEL_ID}")
ENDPOINT = "AWS_BEDROCK_RUNTIME_ENDPOINT"
TOOLS = tool_schemas()  # the agent's own three tools


@pytest.fixture
def front() -> Iterator[BedrockFront]:
    served = OfflineConfig(model_aliases={MODEL_ID: "offline/heuristic"})
    with OfflineProvider(served) as provider, BedrockFront(provider.base_url) as bedrock:
        yield bedrock


def test_the_route_reads_credentials_region_and_endpoint_and_the_driver_hands_them(
    front: BedrockFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = route_facts(MODEL)
    assert facts.provider == "bedrock" and facts.key_variables == ()
    present = {**CREDENTIALS, ENDPOINT: front.base}
    assert set(present) <= set(facts.variables)
    for name, value in present.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    handed = {k: v.get_secret_value() for k, v in driver_keys([MODEL]).items()}
    assert handed == present  # every variable the driver has, and nothing else
    assert scrub(f"{ACCESS_KEY_ID} {SECRET_ACCESS_KEY} {REGION}") == f"*** *** {REGION}"


def test_a_client_with_none_of_the_variables_signs_with_what_it_was_handed(
    front: BedrockFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in route_facts(MODEL).variables:  # a bare node: nothing of the user's
        monkeypatch.delenv(name, raising=False)
    handed = {k: SecretStr(v) for k, v in {**CREDENTIALS, ENDPOINT: front.base}.items()}
    client = LLMClient(MODEL, RetryConfig(max_attempts=1), keys=handed)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You answer questions by searching."},
        {"role": "user", "content": "Which city is the capital of France?"},
    ]
    first = asyncio.run(client.complete(messages, TOOLS))
    assert first.usage.input_tokens > 0
    assert front.seen and {s["key_id"] for s in front.seen} == {ACCESS_KEY_ID}
    assert first.tool_calls  # the heuristic searches first: its answer goes back as toolResult
    messages.append(first.message)
    for call in first.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "Paris."})
    second = asyncio.run(client.complete(messages, TOOLS))
    assert second.usage.input_tokens > first.usage.input_tokens
    assert all(s["path"].endswith("/converse") for s in front.seen)


def _signed(
    front: BedrockFront, key_id: str, secret: str, region: str, body: bytes, sent: bytes = b""
) -> int:
    """The status of a Converse request signed with these credentials for `body`, sent with
    `sent` (default: the body it was signed for)."""
    url = f"{front.base}/model/{MODEL_ID}/converse"
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"Content-Type": "application/json"}
    )
    SigV4Auth(Credentials(key_id, secret), "bedrock", region).add_auth(request)
    out = urllib.request.Request(url, data=sent or body, headers=dict(request.headers.items()))
    try:
        with urllib.request.urlopen(out) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_the_front_refuses_what_bedrock_refuses(front: BedrockFront) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": [{"text": "France?"}]}]}).encode()
    assert _signed(front, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION, body) == 200
    assert _signed(front, "AKIAUNKNOWN000000000", SECRET_ACCESS_KEY, REGION, body) == 403
    assert _signed(front, ACCESS_KEY_ID, "not-the-secret-0000000", REGION, body) == 403
    assert _signed(front, ACCESS_KEY_ID, SECRET_ACCESS_KEY, "eu-west-1", body) == 403
    other = body.replace(b"France", b"Spain")  # signed for one body, sent with another
    assert _signed(front, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION, body, other) == 403
    two_users = {"messages": [{"role": "user", "content": [{"text": "a"}]}] * 2}
    assert (
        _signed(front, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION, json.dumps(two_users).encode())
        == 400
    )
