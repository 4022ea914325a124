"""What a warm worker preloads (`piserini_ray/warm.py`) against what the model client really
imports: checked in a new interpreter, with a real call to the offline provider on loopback."""

from __future__ import annotations

import socket
import textwrap

import orjson
from helpers import fresh_python

from piserini_ray import warm
from piserini_ray.retrieval import jvm

SCRIPT = """
import asyncio, json, sys
from piserini_ray import warm
from piserini_ray.config import ModelConfig, OfflineConfig, RetryConfig
from piserini_ray.offline import OfflineProvider
from piserini_ray.engines.ray.worker import _load_model_modules

_load_model_modules()  # what a replica loads on its import thread: warm's modules and ours
from piserini_ray.llm.check import PROMPT, probe_model
from piserini_ray.llm.client_builder import build_client
from pydantic import SecretStr

offline = OfflineConfig(model_aliases={"gpt-5.4-mini": "offline/heuristic"})
model = ModelConfig(name="gpt-5.4-mini", litellm_model="openai/gpt-5.4-mini")
with OfflineProvider(offline) as provider:
    client = build_client(
        probe_model(model), RetryConfig(max_attempts=1), offline,
        api_base=provider.base_url, limiters=None,
        keys={"OPENAI_API_KEY": SecretStr("sk-test-warm")},
    )
    before = set(sys.modules)
    completion = asyncio.run(client.complete(PROMPT))
    new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("litellm", "openai"))
print(json.dumps({
    "new": new,
    "prompt_tokens": completion.usage.input_tokens,  # the provider's count: it answered
    "first_call": warm.first_call(),
}))
"""


def test_a_first_model_call_after_the_warm_modules_imports_no_more_of_the_client() -> None:
    # The node's model check is the first call of a replica's client, and the first query
    # waits for it: litellm's lazily imported modules (a tenth of a second of CPU at every
    # replica's start) are loaded by the warm worker or the import thread, not by that call.
    # A litellm release that imports others on its first call fails here: add them to
    # `warm.FIRST_CALL`.
    result = orjson.loads(fresh_python(textwrap.dedent(SCRIPT)).strip().splitlines()[-1])
    assert result["prompt_tokens"] > 0
    assert result["new"] == []
    assert result["first_call"] == list(warm.FIRST_CALL)  # each is a module of this litellm


def test_one_warm_worker_of_a_node_has_the_class_archive_made() -> None:
    # Every worker a node pre-starts preloads `warm`: the one that takes the node's mutex has
    # the archive made (a process of its own, which finds this install's archive); while it
    # holds the mutex (here: this test, as another worker would), the others start nothing.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:
        held.bind(warm.archive_mutex())
        assert warm.make_class_archive() is None
    child = warm.make_class_archive()
    assert child is not None
    assert child.wait(timeout=120) == 0  # it found (or made) the archive: exit 0
    assert jvm.ensure_class_archive() is not None
