"""Azure OpenAI's data plane for one deployment, on loopback (or any address): what it refuses,
refused as Azure does (401 for a missing or wrong `api-key`; 404 without `api-version`, for
another deployment or path); what it takes goes on to the offline provider's chat or Responses
route (`upstream`). Used by tests/llm/test_azure_route.py and the two-host kit's driver."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

DEPLOYMENT = "gpt-5.4-mini"
KEY = "azure-test-key-5f1c9a7e2b4d4c0e"
VERSION = "2025-04-01-preview"  # one that has the Responses API, which gpt-5 turns use
AZURE = ("AZURE_API_BASE", "AZURE_API_VERSION", "AZURE_API_KEY")


class AzureFront:
    """The front, on `host` (a free port); `seen` holds each request's path and `api-key`."""

    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        self.seen: list[dict[str, str]] = []
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                front.seen.append({"path": url.path, "api-key": self.headers.get("api-key", "")})
                if self.headers.get("api-key") != KEY:
                    return self._error(401, "401", "Access denied due to invalid subscription key.")
                if "api-version" not in parse_qs(url.query):
                    return self._error(404, "404", "Resource not found")
                if url.path == f"/openai/deployments/{DEPLOYMENT}/chat/completions":
                    route = "chat/completions"
                elif url.path == "/openai/responses":  # the deployment is the body's model
                    route = "responses"
                    if json.loads(body).get("model") != DEPLOYMENT:
                        return self._error(404, "DeploymentNotFound", "no such deployment")
                else:
                    return self._error(404, "DeploymentNotFound", "The API deployment for this "
                                       "resource does not exist.")  # fmt: skip
                request = urllib.request.Request(
                    f"{upstream}/{route}", data=body,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                with urllib.request.urlopen(request, timeout=60) as answer:
                    self._send(answer.status, answer.read())

            def _error(self, status: int, code: str, message: str) -> None:
                self._send(status, json.dumps({"error": {"code": code, "message": message}}))

            def _send(self, status: int, payload: bytes | str) -> None:
                data = payload.encode() if isinstance(payload, str) else payload
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.base = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AzureFront:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
