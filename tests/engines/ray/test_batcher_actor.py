"""The batcher actor gets its key by a method call, never as a creation argument (Ray keeps
creation arguments in the GCS for the cluster's life). The actor's class is run here as it is,
without Ray, against a provider that quotes the key in its errors."""

from __future__ import annotations

import asyncio
import inspect
import secrets
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "llm"))
from echo_provider import EchoProvider

from piserini_ray.engines.ray.batcher_actor import BatcherActor
from piserini_ray.llm.failures import RetryError
from piserini_ray.llm.scrubber import MASK

Actor = BatcherActor.__ray_actor_class__  # type: ignore[attr-defined]


def test_no_key_among_the_creation_arguments() -> None:
    names = list(inspect.signature(Actor.__init__).parameters)
    assert not [n for n in names if "key" in n or "secret" in n or "token" in n], names
    assert "key" in inspect.signature(Actor.unlock).parameters


def test_the_key_comes_by_unlock_and_its_echo_is_scrubbed(tmp_path: Path) -> None:
    key = f"canary-{secrets.token_hex(16)}"
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
    with EchoProvider(statuses=(400,)) as provider:
        actor = Actor("openai", provider.base_url, False, str(tmp_path / "l.jsonl"), 0.05, 0.05, 1)
        with pytest.raises(RuntimeError, match="unlock"):
            asyncio.run(actor.complete(body))
        actor.unlock(SecretStr(key))
        with pytest.raises(RetryError) as failed:
            asyncio.run(actor.complete(body))
    assert any(key in str(headers) for _m, _p, headers in provider.requests)
    assert key not in str(failed.value) and MASK in str(failed.value)
