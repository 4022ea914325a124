"""Azure OpenAI's data plane for one deployment, on loopback (or any address): what it refuses,
refused as Azure does (401 for a missing or wrong `api-key`; 404 without `api-version`, for
another deployment or path); what it takes goes on to the offline provider's chat or Responses
route (`upstream`). Used by tests/llm/test_azure_route.py and the two-host kit's driver."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from loopback_front import LoopbackFront, Reply

DEPLOYMENT = "gpt-5.4-mini"
KEY = "azure-test-key-5f1c9a7e2b4d4c0e"
VERSION = "2025-04-01-preview"  # one that has the Responses API, which gpt-5 turns use
AZURE = ("AZURE_API_BASE", "AZURE_API_VERSION", "AZURE_API_KEY")


class AzureFront(LoopbackFront):
    """The front; `seen` holds each request's path and `api-key`."""

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        url = urlsplit(path)
        self.seen.append({"path": url.path, "api-key": headers.get("api-key", "")})
        if headers.get("api-key") != KEY:
            return _error(401, "401", "Access denied due to invalid subscription key.")
        if "api-version" not in parse_qs(url.query):
            return _error(404, "404", "Resource not found")
        if url.path == f"/openai/deployments/{DEPLOYMENT}/chat/completions":
            route = "chat/completions"
        elif url.path == "/openai/responses":  # the deployment is the body's model
            route = "responses"
            if json.loads(body).get("model") != DEPLOYMENT:
                return _error(404, "DeploymentNotFound", "no such deployment")
        else:
            return _error(
                404, "DeploymentNotFound", "The API deployment for this resource does not exist."
            )
        status, answer = self.forward(route, body)
        return status, answer, {}


def _error(status: int, code: str, message: str) -> Reply:
    return status, {"error": {"code": code, "message": message}}, {}
