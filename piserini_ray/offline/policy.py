"""What an offline model is: a policy that reads a chat-completions request and replies.

The offline provider (an OpenAI-compatible HTTP server on loopback) looks the request's `model`
up in a registry of policies, calls the policy with the parsed request body, and wraps the reply
in a chat-completions response (usage, ids, finish reason), applying latency, quotas, prefix
caching and injected faults on the way. Policies are pure and deterministic: same request, same
reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field


class PolicyToolCall(BaseModel):
    """One function call the policy makes; `arguments` is the JSON text sent to the client."""

    name: str
    arguments: str
    id: str | None = None  # the server assigns `call_<n>` when missing


class PolicyReply(BaseModel):
    content: str | None = None
    tool_calls: list[PolicyToolCall] = Field(default_factory=list)


#: A policy takes the request body (`model`, `messages`, `tools`, ...) and returns its reply.
Policy = Callable[[dict[str, Any]], PolicyReply]


def function_tool(tool: dict[str, Any], schema_key: str) -> dict[str, Any]:
    """A native route's tool definition in the chat-completions shape the policies read
    (`schema_key`: where the route keeps the JSON schema, `input_schema` or `parameters`)."""
    return {
        "type": "function",
        "function": {
            "name": tool.get("name"),
            "description": tool.get("description", ""),
            "parameters": tool.get(schema_key, {}),
        },
    }


def reasoning_text(reply: PolicyReply) -> str:
    """What an offline model "thought" before its reply (a thinking block, a DeepSeek
    `reasoning_content`): a line naming its next step, deterministic."""
    if reply.tool_calls:
        steps = ", ".join(f"{c.name} {c.arguments}" for c in reply.tool_calls)
        return f"The evidence so far is not enough; next: {steps}."
    return "I have enough to answer; writing the final answer."
