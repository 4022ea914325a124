"""A stand-in for a serving engine's OpenAI-compatible server (vLLM's `vllm serve`, SGLang's
`launch_server`): it takes their command line, writes it to `$STAND_IN_ARGV`, and answers
`/health` and `/v1/models` as they do, or misbehaves as `$STAND_IN_MODE` says: `exit` (ends
with a message before answering), `silent` (never answers), `wrong-name` (serves another
model). What the tests check is our side: the command, the health protocol, the messages."""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def main() -> None:
    argv = sys.argv[1:]
    with open(os.environ["STAND_IN_ARGV"], "w") as out:
        json.dump(argv, out)
    mode = os.environ.get("STAND_IN_MODE", "ok")
    print(f"stand-in engine starting with {argv}", flush=True)
    if mode == "exit":
        print("RuntimeError: CUDA out of memory while loading the weights", flush=True)
        sys.exit(3)
    if mode == "silent":
        print("loading weights ...", flush=True)
        time.sleep(3600)
    name = _option(argv, "--served-model-name")
    served = "another-model" if mode == "wrong-name" else name

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"object": "list", "data": [{"id": served}]}).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((_option(argv, "--host"), int(_option(argv, "--port"))), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
