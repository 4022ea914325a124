"""A provider's front on loopback (or any address) for the tests: an HTTP server on its own
thread that answers each POST with `answer` (a subclass's: the provider's checks and its wire
format) and passes what it takes on to the offline provider (`forward`). The Azure and Bedrock
fronts (`azure_front.py`, `bedrock_front.py`) are its subclasses."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

#: A reply: its status, its JSON body, and headers beside Content-Type and Content-Length.
Reply = tuple[int, Any, dict[str, str]]


class LoopbackFront:
    """The front, on `host` (a free port), before the offline provider at `upstream` (its
    `/v1` base); `seen` holds what `answer` notes of each request."""

    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self.seen: list[dict[str, str]] = []
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, payload, extra = front.answer(self.path, headers, body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.base = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        raise NotImplementedError

    def forward(self, route: str, body: bytes) -> tuple[int, bytes]:
        """The offline provider's answer to `body` on its `route` (`chat/completions`, ...)."""
        request = urllib.request.Request(
            f"{self.upstream}/{route}", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(answer.status), answer.read()

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
