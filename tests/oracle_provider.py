"""A model on 127.0.0.1 that knows the answers: OpenAI's chat completions route, answering each
question of a benchmark with its gold answer at once (no tool call), with real usage. Beside
the offline heuristic (a few percent right on the sample) it is a run that is clearly better,
so a paired comparison between the two is decided early: what `stop_when_decided` tests need."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from piserini_ray.data import Query

#: The one-word check (`llm/check.py`).
CHECK_PROMPT = "Reply with the single word OK."


class OracleProvider:
    """`with OracleProvider(queries) as p:` serves at `p.base_url` (`.../v1`); `p.answered`
    counts the questions answered."""

    def __init__(self, queries: list[Query]) -> None:
        self.answers = {q.query: q.answer for q in queries}
        self.answered = 0
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                status, reply = provider.reply(self.path, request)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def reply(self, path: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not path.endswith("/chat/completions"):
            return 404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}}
        text = json.dumps(request.get("messages") or [])
        if CHECK_PROMPT in text:
            content = "OK"
        else:
            gold = next((a for q, a in self.answers.items() if json.dumps(q)[1:-1] in text), None)
            if gold is None:
                message = "no question of the benchmark in the request"
                return 400, {"error": {"message": message, "type": "invalid_request_error"}}
            with self._lock:
                self.answered += 1
            content = f"Explanation: I know it.\nExact Answer: {gold}\nConfidence: 95%"
        prompt = max(1, len(text) // 4)
        return 200, {
            "id": "chatcmpl-oracle",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model", "oracle"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 20,
                "total_tokens": prompt + 20,
            },
        }

    def __enter__(self) -> OracleProvider:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
