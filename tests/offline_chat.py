"""A chat-completions agent, its requests and a poster, shared by the offline provider's tests
(`tests/offline/test_server.py`) and the test kit's (`tests/testkit/`)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from piserini_ray.offline import (
    OfflineProvider,
    PolicyReply,
    PolicyToolCall,
    exact_match_judge_policy,
)

AGENT = "test/agent"
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the corpus.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "reason": {"type": "string"}},
            "required": ["query", "reason"],
        },
    },
}


def agent_policy(request: dict[str, Any]) -> PolicyReply:
    """Searches for the last user message; answers once a tool result is in the history."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return PolicyReply(content="Explanation: found it.\nExact Answer: Paris")
    arguments = json.dumps({"query": last["content"], "reason": "look it up"})
    return PolicyReply(tool_calls=[PolicyToolCall(name="search", arguments=arguments)])


POLICIES = {AGENT: agent_policy, "offline/exact-match-judge": exact_match_judge_policy}


def conversation(
    question: str = "Where is the Louvre?", system: str = "You answer with the search tool."
) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def tool_call(call_id: str) -> dict[str, Any]:
    arguments = json.dumps({"query": "louvre", "reason": "find the city"})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "search", "arguments": arguments},
    }


def chat_body(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": AGENT, "messages": messages or conversation(), "tools": [SEARCH_TOOL]} | extra


def post(
    provider: OfflineProvider, body: Any, key: str | None = "k1", timeout: float | None = 10
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{provider.base_url}/chat/completions"
    return httpx.post(url, json=body, headers=headers, timeout=timeout)


def first_tool_call(response: httpx.Response) -> dict[str, Any]:
    return response.json()["choices"][0]["message"]["tool_calls"][0]["function"]
