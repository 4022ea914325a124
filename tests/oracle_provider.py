"""A model on 127.0.0.1 that knows the answers: OpenAI's chat completions route (a
`LoopbackFront` that forwards nothing), answering each question of a benchmark with its gold
answer at once (no tool call), with real usage. Beside the offline heuristic (a few percent
right on the sample) it is a run that is clearly better, so a paired comparison between the
two is decided early: what `stop_when_decided` tests need."""

from __future__ import annotations

import json
import threading

from loopback_front import LoopbackFront, Reply

from piserini_ray.data import Query

#: The one-word check (`llm/check.py`).
CHECK_PROMPT = "Reply with the single word OK."


class OracleProvider(LoopbackFront):
    """`with OracleProvider(queries) as p:` serves at `p.base_url` (`.../v1`); `p.answered`
    counts the questions answered."""

    def __init__(self, queries: list[Query]) -> None:
        super().__init__(upstream="")
        self.base_url = f"{self.base}/v1"
        self.answers = {json.dumps(q.query)[1:-1]: q.answer for q in queries}
        self.answered = 0
        self._lock = threading.Lock()

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        if not path.endswith("/chat/completions"):
            return 404, {"error": {"message": f"no route {path}", "type": "invalid_request"}}, {}
        request = json.loads(body or b"{}")
        text = json.dumps(request.get("messages") or [])
        if CHECK_PROMPT in text:
            content = "OK"
        else:
            gold = next((a for q, a in self.answers.items() if q in text), None)
            if gold is None:
                error = {"message": "no question of the benchmark in the request"}
                return 400, {"error": {**error, "type": "invalid_request_error"}}, {}
            with self._lock:
                self.answered += 1
            content = f"Explanation: I know it.\nExact Answer: {gold}\nConfidence: 95%"
        prompt = max(1, len(text) // 4)
        message = {"role": "assistant", "content": content}
        return (
            200,
            {
                "id": "chatcmpl-oracle",
                "object": "chat.completion",
                "created": 0,
                "model": request.get("model", "oracle"),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": 20,
                    "total_tokens": prompt + 20,
                },
            },
            {},
        )
