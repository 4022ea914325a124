"""A provider on 127.0.0.1 that records every request and quotes the key it was sent in its
errors (some real providers and proxies echo headers in error bodies): what the key-leak tests
run against. OpenAI-compatible: chat completions, files and batches."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: The one-word check (`llm/check.py`) is answered, so that a run gets to its queries.
CHECK_PROMPT = "Reply with the single word OK."


class EchoProvider:
    """`with EchoProvider() as p:` serves at `p.base_url` (`.../v1`); `p.requests` holds
    (method, path, headers) of every request received. `answer_check`: the one-word check gets
    a reply; everything else gets an error whose body quotes the request's `Authorization`
    header, its status taken from `statuses` in turn (a 500 is retried, a 400 is not)."""

    def __init__(self, answer_check: bool = True, statuses: tuple[int, ...] = (500, 400)) -> None:
        self.answer_check = answer_check
        self.statuses = statuses
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._turn = itertools.count()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                provider.requests.append((self.command, self.path, dict(self.headers)))
                status, reply = provider.reply(self.path, dict(self.headers), body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def reply(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        auth = headers.get("Authorization") or headers.get("x-api-key") or ""
        if self.answer_check and path.endswith("/chat/completions") and CHECK_PROMPT in str(body):
            return 200, {
                "id": "chatcmpl-check",
                "object": "chat.completion",
                "created": 0,
                "model": "echo",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "OK"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        status = self.statuses[next(self._turn) % len(self.statuses)]
        message = f"request refused; you sent Authorization: {auth} (headers {headers})"
        kind = "server_error" if status == 500 else "invalid_request_error"
        return status, {"error": {"message": message, "type": kind, "code": None}}

    def __enter__(self) -> EchoProvider:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
