"""The offline provider over real HTTP (httpx), and through litellm as the framework uses it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import wait_for
from offline_chat import (
    AGENT,
    POLICIES,
    SEARCH_TOOL,
    chat_body,
    conversation,
    post,
    tool_call,
)

import piserini_ray
from piserini_ray.offline import (
    LatencyConfig,
    OfflineConfig,
    OfflineProvider,
    QuotaConfig,
    exact_match_judge_policy,
)
from piserini_ray.offline.judge_policy import answers_match, judge, normalize_answer
from piserini_ray.offline.server import Usage, default_policies, key_hash
from piserini_ray.offline.tokens import (
    count_completion_tokens,
    count_message_tokens,
    count_prompt_tokens,
    count_text_tokens,
)
from piserini_ray_testkit import EmulatedProvider, FaultRates, Scripted

# No network here: use litellm's bundled price map instead of retrying a download on import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture
def provider() -> Iterator[OfflineProvider]:
    with OfflineProvider(OfflineConfig(), POLICIES) as running:
        yield running


@pytest.fixture
def emulated() -> Iterator[EmulatedProvider]:
    """The test kit's provider, for a product behaviour only a scripted fault reaches."""
    with EmulatedProvider(OfflineConfig(), POLICIES) as running:
        yield running


def test_models_list(provider: OfflineProvider) -> None:
    response = httpx.get(f"{provider.base_url}/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [AGENT, "offline/exact-match-judge"]
    assert all(m["object"] == "model" for m in body["data"])


def test_default_registry_serves_the_judge() -> None:
    assert default_policies()["offline/exact-match-judge"] is exact_match_judge_policy


def test_request_log_keeps_the_most_recent_only() -> None:
    """Each logged request holds its whole conversation: a long rehearsal keeps the last few."""
    with OfflineProvider(OfflineConfig(request_log=3), POLICIES) as provider:
        for i in range(5):
            assert post(provider, chat_body(conversation(f"question {i}"))).status_code == 200
        logged = provider.requests
    assert [r.seq for r in logged] == [3, 4, 5]
    assert [r.messages[-1]["content"] for r in logged] == [f"question {i}" for i in (2, 3, 4)]


def test_serve_blocks_until_ctrl_c() -> None:
    code = "from piserini_ray.offline import serve; serve()"
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("offline provider listening on http://127.0.0.1:")
        base_url = line.split()[-1]
        models = httpx.get(f"{base_url}/models", timeout=10).json()["data"]
        assert "offline/exact-match-judge" in [m["id"] for m in models]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_tool_call_reply_shape(provider: OfflineProvider) -> None:
    first = post(provider, chat_body()).json()
    second = post(provider, chat_body()).json()
    assert first["object"] == "chat.completion" and first["model"] == AGENT
    choice = first["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["role"] == "assistant"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "search"
    assert json.loads(call["function"]["arguments"])["query"] == "Where is the Louvre?"
    assert call["id"].startswith("call_")
    assert call["id"] != second["choices"][0]["message"]["tool_calls"][0]["id"]
    assert first["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_text_reply_has_stop_and_no_tool_calls(provider: OfflineProvider) -> None:
    messages = [
        *conversation(),
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_9")]},
        {"role": "tool", "tool_call_id": "call_9", "content": "The Louvre is in Paris."},
    ]
    choice = post(provider, chat_body(messages)).json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"].endswith("Exact Answer: Paris")
    assert not choice["message"].get("tool_calls")


def test_unknown_model_is_404(provider: OfflineProvider) -> None:
    response = post(provider, chat_body(model="gpt-nope"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "model_not_found"
    assert "gpt-nope" in error["message"]


def test_bad_bodies_are_400(provider: OfflineProvider) -> None:
    bad_json = httpx.post(
        f"{provider.base_url}/chat/completions",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["type"] == "invalid_request_error"
    missing = post(provider, {"model": AGENT})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    streaming = post(provider, chat_body(stream=True))
    assert streaming.status_code == 400
    assert "streaming is not supported" in streaming.json()["error"]["message"]


def test_missing_key_is_401_when_required() -> None:
    with OfflineProvider(OfflineConfig(require_key=True), POLICIES) as provider:
        response = post(provider, chat_body(), key=None)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        assert post(provider, chat_body(), key="secret-value").status_code == 200
        assert httpx.get(f"{provider.base_url}/models").status_code == 401
        records = provider.requests
    assert [r.status for r in records] == [401, 200]
    assert records[1].key_hash == key_hash("secret-value")
    assert "secret-value" not in repr(records)


def test_usage_equals_the_token_rule(provider: OfflineProvider) -> None:
    messages = [
        *conversation(),
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_a")]},
        {"role": "tool", "tool_call_id": "call_a", "name": "search", "content": "1. Louvre"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "?"}],
        },
    ]
    body = post(provider, chat_body(messages)).json()
    usage = body["usage"]
    assert usage["prompt_tokens"] == count_prompt_tokens(messages, [SEARCH_TOOL])
    message = body["choices"][0]["message"]
    assert usage["completion_tokens"] == count_completion_tokens(
        message["content"], message["tool_calls"]
    )
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # The rule, spelled out for one message: overhead + role + content.
    assert count_message_tokens({"role": "user", "content": "hello world"}) == 3 + 1 + 2
    assert count_text_tokens("hello world") == 2  # cl100k_base: "hello", " world"
    recorded = provider.requests[-1].usage
    assert recorded is not None and recorded.prompt_tokens == usage["prompt_tokens"]


def subprocess_env() -> dict[str, str]:
    """This checkout first on the path, whatever the editable install points at."""
    return os.environ | {"PYTHONPATH": str(Path(piserini_ray.__file__).resolve().parents[1])}


def test_tokenizer_loads_without_network() -> None:
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network used')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "from piserini_ray.offline.tokens import count_text_tokens\n"
        "print(count_text_tokens('hello world'))\n"
    )
    env = {k: v for k, v in subprocess_env().items() if "TIKTOKEN" not in k}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


#: A system prompt long enough (> 1,024 tokens) for OpenAI to cache at all.
LONG_SYSTEM = "You answer with the search tool and cite the documents you read. " * 120


def billed_steps(shared: int) -> int:
    """OpenAI's published rule, written out here independently of the emulator."""
    return 0 if shared < 1024 else 1024 + (shared - 1024) // 128 * 128


def test_prefix_caching_counts_shared_leading_messages(provider: OfflineProvider) -> None:
    def convo(question: str = "Where is the Louvre?") -> list[dict[str, Any]]:
        return conversation(question, LONG_SYSTEM)

    first = post(provider, chat_body(convo())).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    history = [
        *convo(),
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_x")]},
        {"role": "tool", "tool_call_id": "call_x", "content": "The Louvre is in Paris."},
    ]
    second = post(provider, chat_body(history)).json()["usage"]
    # The tools lead the cacheable prefix, as on real providers; hits are billed in steps.
    tools = count_text_tokens(json.dumps([SEARCH_TOOL], separators=(",", ":")))
    shared = tools + sum(count_message_tokens(m) for m in convo())
    assert shared > 1024 and shared % 128 != 0  # so the step rounds something off
    assert second["prompt_tokens_details"]["cached_tokens"] == billed_steps(shared) < shared
    assert 0 < shared < second["prompt_tokens"]
    third = post(provider, chat_body([*history, {"role": "user", "content": "More?"}])).json()
    cached = tools + sum(count_message_tokens(m) for m in history)
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == billed_steps(cached)
    # A new conversation with the same tools and system prompt hits that shared head only.
    other = post(provider, chat_body(convo("Where is the Prado?"))).json()
    head = tools + count_message_tokens(convo()[0])
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == billed_steps(head)
    changed = [{"role": "system", "content": "Another prompt. " + LONG_SYSTEM}, convo()[1]]
    fresh = post(provider, chat_body(changed)).json()
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    conversations = {r.conversation for r in provider.requests}
    assert len(conversations) == 3


def test_a_shared_prefix_under_1024_tokens_is_not_cached(provider: OfflineProvider) -> None:
    post(provider, chat_body())
    history = [*conversation(), {"role": "assistant", "content": "Paris."}]
    again = post(provider, chat_body([*history, {"role": "user", "content": "And?"}])).json()
    assert again["usage"]["prompt_tokens"] < 1024
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_prefix_caching_can_be_disabled() -> None:
    with OfflineProvider(OfflineConfig(prefix_caching=False), POLICIES) as provider:
        post(provider, chat_body())
        usage = post(provider, chat_body()).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_requests_per_minute_quota_is_per_key() -> None:
    config = OfflineConfig(quotas=QuotaConfig(requests_per_minute=2))
    with OfflineProvider(config, POLICIES) as provider:
        assert [post(provider, chat_body()).status_code for _ in range(2)] == [200, 200]
        limited = post(provider, chat_body())
        assert limited.status_code == 429
        assert int(limited.headers["Retry-After"]) >= 1
        error = limited.json()["error"]
        assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"
        assert error["message"].startswith("Rate limit reached")
        # OpenAI's rate-limit headers: the full window says so (reset as a Go duration).
        assert limited.headers["x-ratelimit-limit-requests"] == "2"
        assert limited.headers["x-ratelimit-remaining-requests"] == "0"
        assert limited.headers["x-ratelimit-reset-requests"].endswith("s")
        assert post(provider, chat_body(), key="k2").status_code == 200
        assert [r.fault for r in provider.requests] == [None, None, "quota", None]


def test_tokens_per_minute_quota_and_rejections_are_free() -> None:
    small = count_prompt_tokens(conversation(), [SEARCH_TOOL])
    config = OfflineConfig(quotas=QuotaConfig(tokens_per_minute=3 * small))
    with OfflineProvider(config, POLICIES) as provider:
        assert post(provider, chat_body()).status_code == 200
        huge = post(provider, chat_body(conversation("word " * (4 * small))))
        assert huge.status_code == 429 and huge.json()["error"]["type"] == "tokens"
        assert int(huge.headers["Retry-After"]) >= 1
        assert huge.headers["x-ratelimit-limit-tokens"] == str(3 * small)
        assert "x-ratelimit-limit-requests" not in huge.headers  # no request quota set
        # The rejected request consumed nothing, so one more small request still fits.
        assert post(provider, chat_body()).status_code == 200
        assert post(provider, chat_body()).status_code == 429


def test_scripted_hang_is_cut_by_client_timeout(emulated: EmulatedProvider) -> None:
    provider = emulated
    provider.script(Scripted(kind="hang", seconds=3600))
    with pytest.raises(httpx.ReadTimeout):
        post(provider, chat_body(), timeout=0.3)
    assert post(provider, chat_body()).status_code == 200
    # The client went away, so the server cancels the hung handler (liveness, not speed).
    wait_for("the hung handler cancelled", lambda: provider.in_flight == 0, 20)
    hung = next(r for r in provider.requests if r.fault == "hang")
    assert hung.status is None
    # The request was admitted, so its prompt is billed (as uncached input, nothing else).
    assert hung.cut and hung.usage is not None
    answered = next(r for r in provider.requests if r.status == 200)
    assert answered.usage is not None and not answered.cut
    assert hung.usage == Usage(answered.usage.prompt_tokens, 0, 0)  # the same request body
    line = provider.bill[("standard", hung.model)]
    assert (line.requests, line.cut_requests) == (2, 1)
    assert line.cut_prompt_tokens == hung.usage.prompt_tokens
    assert line.prompt_tokens == 2 * hung.usage.prompt_tokens


def test_a_request_refused_before_admission_is_not_billed(emulated: EmulatedProvider) -> None:
    """A 400 or a 429 is answered before anything runs: nothing on the bill, nothing cut."""
    provider = emulated
    provider.script(Scripted(kind="rate_limit"))
    assert post(provider, chat_body()).status_code == 429
    for bad in ({"temperature": 9}, {"top_p": -1}, {"service_tier": "cheap"}):
        refused = post(provider, chat_body(**bad))
        assert refused.status_code == 400, bad
        assert refused.json()["error"]["param"] == next(iter(bad))
    assert provider.bill == {}
    assert not any(r.cut or r.usage for r in provider.requests)


def test_shutdown_does_not_wait_for_hung_requests() -> None:
    hangs = FaultRates(hang=1.0)  # every request hangs for an hour
    provider = EmulatedProvider(OfflineConfig(), POLICIES, faults=hangs).start()
    errors: list[BaseException] = []

    def client() -> None:
        try:
            post(provider, chat_body(), timeout=None)
        except httpx.HTTPError as error:
            errors.append(error)

    thread = threading.Thread(target=client)
    thread.start()
    wait_for("the request in flight", lambda: provider.in_flight == 1, 20)
    port = provider.port
    provider.stop()
    thread.join(20)
    assert not thread.is_alive() and errors  # the client saw the connection go away
    assert provider._thread is not None and not provider._thread.is_alive()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_fixed_latency_adds_at_least_that_delay_and_overlaps() -> None:
    config = OfflineConfig(latency=LatencyConfig(kind="fixed", seconds=0.4))
    with OfflineProvider(config, POLICIES) as provider:
        assert post(provider, chat_body()).status_code == 200
        assert provider.requests[0].delayed == 0.4

        async def two_at_once() -> list[int]:
            async with httpx.AsyncClient(timeout=10) as client:
                url = f"{provider.base_url}/chat/completions"
                replies = await asyncio.gather(
                    *(client.post(url, json=chat_body()) for _ in range(2))
                )
            return [r.status_code for r in replies]

        assert asyncio.run(two_at_once()) == [200, 200]
        assert max(r.concurrent for r in provider.requests) == 2  # the two overlapped


def test_lognormal_latency_is_valid_config() -> None:
    latency = LatencyConfig(kind="lognormal", seconds=0.01, sigma=0.5, max_seconds=0.05)
    with OfflineProvider(OfflineConfig(latency=latency), POLICIES) as provider:
        assert post(provider, chat_body()).status_code == 200
    with pytest.raises(ValueError):
        LatencyConfig(kind="lognormal", seconds=0)


# -- the judge policy -------------------------------------------------------------------------


def judge_prompt(response: str, gold: str, aliases: str | None = None) -> str:
    lines = [
        "Judge whether the following [response] to [question] is correct.",
        "",
        "[question]: What is the capital of France?",
        "",
        f"[response]: {response}",
        "",
        f"[correct_answer]: {gold}",
    ]
    if aliases is not None:
        lines.append(f"[accepted_answers]: {aliases}")
    lines += ["", "reasoning: explain. correct: yes or no."]
    return "\n".join(lines)


JUDGE_CASES = [
    ("Explanation: obvious.\nExact Answer: Paris\nConfidence: 90%", "Paris", None, True),
    ("Exact Answer: Lutetia", "Paris", "Lutetia | Paname", True),
    ("Exact Answer: 1,000", "1000", None, True),
    ("Exact Answer: 35", "35.0", None, True),
    ("Exact Answer: 12%", "12", None, True),
    ("Long text\nspanning lines.\n**Exact Answer:** *The Paris*\n", "paris", None, True),
    ("**Exact answer**: Paris", "Paris", None, True),
    ("Exact Answer: Paris, the capital city", "Paris", None, True),
    ("Exact Answer: Paris is probably the capital city", "Paris", None, False),
    ("Exact Answer: Lyon", "Paris", "Lutetia", False),
    ("Exact Answer: 10000", "1000", None, False),
    ("I think it is Paris.", "Paris", None, False),
]


@pytest.mark.parametrize(("response", "gold", "aliases", "correct"), JUDGE_CASES)
def test_judge_cases(response: str, gold: str, aliases: str | None, correct: bool) -> None:
    verdict = judge(judge_prompt(response, gold, aliases))
    assert verdict["correct"] is correct
    assert verdict["correct_answer"] == gold
    assert verdict["reasoning"] and verdict["confidence"] == 100
    if "Exact" not in response:
        assert verdict["extracted_final_answer"] is None


@pytest.mark.parametrize(
    ("answer", "gold", "strict", "exact_match", "lenient"),
    [
        ("Paris", "paris", True, True, True),  # normalised: every judge
        ("1,000", "1000.0", True, True, True),  # the same number: every judge
        ("Paris, France", "Paris", False, True, True),  # contained, 1 extra word
        ("Paris is probably the capital city", "Paris", False, False, True),  # contained, 5
        ("The Finnish", "The Finnish markka", False, False, True),  # a part of the gold
        ("Stockholm Central Station", "Stockholm Arlanda Airport", False, False, False),
        ("Arlanda Airport Stockholm", "Stockholm Arlanda Airport", False, False, True),  # overlap
        ("10000", "1000", False, False, False),  # numbers decide alone
    ],
)
def test_the_offline_judges_disagree_by_their_rules(
    answer: str, gold: str, strict: bool, exact_match: bool, lenient: bool
) -> None:
    """Three offline judges of known strictness, so that a judge-agreement rehearsal is not
    trivially kappa = 1; all three are served."""
    prompt = judge_prompt(f"Exact Answer: {answer}", gold)
    got = {s: judge(prompt, s)["correct"] for s in ("strict", "exact-match", "lenient")}
    assert got == {"strict": strict, "exact-match": exact_match, "lenient": lenient}
    assert {"offline/strict-judge", "offline/lenient-judge"} <= set(default_policies())


def test_judge_helpers() -> None:
    assert normalize_answer("  The U.S.A.,  Inc! ") == "usa inc"
    assert normalize_answer("ＡＢＣ 35.0 1,000") == "abc 35 1000"
    assert answers_match("an Apple", "apple")
    assert not answers_match("pear", "apple")


def test_judge_through_the_server(provider: OfflineProvider) -> None:
    messages = [
        {"role": "system", "content": "You are a judge."},
        {"role": "user", "content": judge_prompt("**Exact Answer:** Paris", "Paris")},
    ]
    body = {
        "model": "offline/exact-match-judge",
        "messages": messages,
        "response_format": {"type": "json_object"},
    }
    content = post(provider, body).json()["choices"][0]["message"]["content"]
    verdict = json.loads(content)
    assert set(verdict) == {
        "extracted_final_answer",
        "correct_answer",
        "reasoning",
        "correct",
        "confidence",
    }
    assert verdict["extracted_final_answer"] == "Paris" and verdict["correct"] is True


# -- through litellm, as the framework calls it ------------------------------------------------


def test_litellm_tool_call_and_cached_tokens(provider: OfflineProvider) -> None:
    import litellm

    async def call(messages: list[dict[str, Any]]) -> Any:
        return await litellm.acompletion(
            model=f"openai/{AGENT}",
            api_base=provider.base_url,
            api_key="test-key",
            messages=messages,
            tools=[SEARCH_TOOL],
            num_retries=0,
        )

    long = conversation(system=LONG_SYSTEM)  # over 1,024 tokens: OpenAI caches it
    first = asyncio.run(call(long))
    (call_1,) = first.choices[0].message.tool_calls
    assert call_1.function.name == "search"
    assert json.loads(call_1.function.arguments)["reason"] == "look it up"
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.usage.prompt_tokens == count_prompt_tokens(long, [SEARCH_TOOL])
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    history = [
        *long,
        {"role": "assistant", "content": None, "tool_calls": [tool_call(call_1.id)]},
        {"role": "tool", "tool_call_id": call_1.id, "content": "The Louvre is in Paris."},
    ]
    second = asyncio.run(call(history))
    assert second.choices[0].message.content.endswith("Exact Answer: Paris")
    tools = count_text_tokens(json.dumps([SEARCH_TOOL], separators=(",", ":")))
    shared = tools + sum(count_message_tokens(m) for m in long)
    assert second.usage.prompt_tokens_details.cached_tokens == billed_steps(shared) > 0
    assert provider.requests[0].key_hash == key_hash("test-key")
