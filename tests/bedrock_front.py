"""Bedrock's runtime for one model's Converse API, on loopback (or any address), as strict as
Bedrock on what it checks: the SigV4 signature of every request (recomputed with botocore from
the front's own credentials: an unknown access key is 403 `UnrecognizedClientException`, a
wrong signature or a request signed for another region or more than five minutes away 403
`InvalidSignatureException`), the model in the path, and a conversation that starts with the
user and alternates (400 `ValidationException`). What it takes is translated to OpenAI's chat
format, answered by the offline provider's chat route (`upstream`), and translated back into
Converse's reply (`output.message.content` blocks, `stopReason`, `usage`).

Used by tests/llm/test_bedrock_route.py and the two-host kit's driver."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from loopback_front import LoopbackFront, Reply

MODEL_ID = "anthropic.claude-haiku-4-5-20251001-v1:0"
ACCESS_KEY_ID = "AKIAPISERINITEST0001"
SECRET_ACCESS_KEY = "bedrock-test-secret-9d2e5c1a7f3b4e8d"
REGION = "us-east-1"
#: The variables a Bedrock call reads (`routes.route_facts`), less the endpoint (the front's).
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
    "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
    "AWS_REGION_NAME": REGION,
}
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


class Refused(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def _check_signature(method: str, url: str, headers: dict[str, str], body: bytes) -> None:
    authorization = headers.get("authorization", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        raise Refused(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
    fields = dict(
        part.strip().split("=", 1)
        for part in authorization.removeprefix("AWS4-HMAC-SHA256 ").split(",")
    )
    key_id, date, region, service, _ = fields["Credential"].split("/")
    if key_id != ACCESS_KEY_ID:
        raise Refused(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    amz_date = headers.get("x-amz-date", "")
    signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    if (
        abs((datetime.now(UTC) - signed_at).total_seconds()) > 300
        or region != REGION
        or service != "bedrock"
    ):
        raise Refused(
            403, "InvalidSignatureException", "Signature expired or signed for another scope."
        )
    signed = fields["SignedHeaders"].split(";")
    request = AWSRequest(method=method, url=url, data=body, headers={h: headers[h] for h in signed})
    request.context["timestamp"] = amz_date
    auth = SigV4Auth(Credentials(ACCESS_KEY_ID, SECRET_ACCESS_KEY), "bedrock", REGION)
    expected = auth.signature(
        auth.string_to_sign(request, auth.canonical_request(request)), request
    )
    if fields["Signature"] != expected or date != amz_date[:8]:
        raise Refused(
            403,
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided.",
        )


def _to_chat(converse: dict[str, Any]) -> dict[str, Any]:
    """A Converse request as OpenAI's chat request."""
    messages: list[dict[str, Any]] = []
    system = " ".join(block["text"] for block in converse.get("system", []) if "text" in block)
    if system:
        messages.append({"role": "system", "content": system})
    roles = [m["role"] for m in converse["messages"]]
    if not roles or roles[0] != "user" or any(a == b for a, b in itertools.pairwise(roles)):
        raise Refused(400, "ValidationException", "A conversation must start with a user message "
                      "and alternate between user and assistant roles.")  # fmt: skip
    for message in converse["messages"]:
        texts = [b["text"] for b in message["content"] if "text" in b]
        if message["role"] == "assistant":
            uses = [b["toolUse"] for b in message["content"] if "toolUse" in b]
            calls = [
                {
                    "id": use["toolUseId"],
                    "type": "function",
                    "function": {"name": use["name"], "arguments": json.dumps(use["input"])},
                }
                for use in uses
            ]
            turn: dict[str, Any] = {"role": "assistant", "content": " ".join(texts) or None}
            if calls:
                turn["tool_calls"] = calls
            messages.append(turn)
            continue
        for block in message["content"]:
            if "toolResult" in block:
                result = block["toolResult"]
                content = "".join(
                    c["text"] if "text" in c else json.dumps(c["json"]) for c in result["content"]
                )
                messages.append(
                    {"role": "tool", "tool_call_id": result["toolUseId"], "content": content}
                )
        if texts:
            messages.append({"role": "user", "content": " ".join(texts)})
    chat: dict[str, Any] = {"model": MODEL_ID, "messages": messages}
    tools = converse.get("toolConfig", {}).get("tools", [])
    if tools:
        chat["tools"] = [
            {"type": "function", "function": {"name": t["toolSpec"]["name"],
             "description": t["toolSpec"].get("description", ""),
             "parameters": t["toolSpec"]["inputSchema"]["json"]}}
            for t in tools
        ]  # fmt: skip
    if (limit := converse.get("inferenceConfig", {}).get("maxTokens")) is not None:
        chat["max_tokens"] = limit
    return chat


def _to_converse(chat: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's chat reply as Converse's."""
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        arguments = json.loads(function["arguments"] or "{}")
        use = {"toolUseId": call["id"], "name": function["name"], "input": arguments}
        content.append({"toolUse": use})
    usage = chat.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    prompt = usage.get("prompt_tokens", 0)
    converse_usage = {
        "inputTokens": prompt - cached,  # Bedrock counts cache reads apart from the input
        "outputTokens": usage.get("completion_tokens", 0),
        "totalTokens": prompt + usage.get("completion_tokens", 0),
    }
    if cached:
        converse_usage["cacheReadInputTokens"] = cached
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
        "usage": converse_usage,
        "metrics": {"latencyMs": 1},
    }


class BedrockFront(LoopbackFront):
    """The front; `seen` holds each request's path and access key id."""

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        credential = headers.get("authorization", "").partition("Credential=")[2]
        self.seen.append({"path": path, "key_id": credential.split("/")[0]})
        try:
            _check_signature("POST", f"http://{headers['host']}{path}", headers, body)
            if unquote(path) != f"/model/{MODEL_ID}/converse":
                raise Refused(
                    400, "ValidationException", "The provided model identifier is invalid."
                )
            chat = _to_chat(json.loads(body))
        except Refused as refused:
            return refused.status, {"message": refused.message}, {"x-amzn-ErrorType": refused.kind}
        status, answer = self.forward("chat/completions", json.dumps(chat).encode())
        return status, _to_converse(json.loads(answer)), {}
