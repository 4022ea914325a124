"""On a machine with a GPU: check that a served model works there before a run relies on it
(issue 51). It lists the GPUs (`nvidia-smi`), starts the engine's server exactly as a run
would (`serving/process.py`, the engine's preset), sends a few chat requests with the agent's
three tools, and prints a table: start-up seconds, whether it answered with a tool call,
prompt and completion tokens per second. No GPU, or the engine missing, is said in one line.

    python bench/gpu_serving_check.py --engine vllm --model Qwen/Qwen3-32B \
        --name qwen3-32b -- --max-model-len 32768 --tensor-parallel-size 2
    python bench/gpu_serving_check.py --engine sglang --model /models/qwen3 --name qwen3
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
import urllib.request

from _common import append_results, header

from piserini_ray.config import ToolsConfig
from piserini_ray.config.serving import ServeConfig
from piserini_ray.serving import ServerProcess
from piserini_ray.tools import tool_schemas

QUESTION = (
    "Which university did the author of the 1994 paper on fluid dynamics attend? "
    "Search the corpus before you answer."
)


def gpus() -> list[str]:
    """One line per GPU (`nvidia-smi`), none without one."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def chat(base: str, name: str) -> tuple[dict, float]:
    body = {
        "model": name,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": tool_schemas(ToolsConfig()),
        "max_tokens": 256,
    }
    request = urllib.request.Request(
        f"{base}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.load(answer), time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sglang", "llama.cpp"), required=True)
    parser.add_argument("--model", required=True, help="as serve.model takes it")
    parser.add_argument("--name", required=True, help="the model name (model.name)")
    parser.add_argument("--executable", help="as serve.executable")
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("args", nargs="*", help="the engine's own arguments (after --)")
    args = parser.parse_args()
    found = gpus()
    if not found and args.engine != "llama.cpp":
        raise SystemExit("no GPU here (nvidia-smi lists none): run this on a GPU node")
    serve = ServeConfig(
        engine=args.engine,
        model=args.model,
        executable=args.executable,
        args=args.args,
        num_gpus=len(found),
        startup_timeout=3600,
    )
    server = ServerProcess(serve, args.name, "this-node")
    began = time.perf_counter()
    base = server.start()
    started = time.perf_counter() - began
    rows = []
    try:
        for _ in range(args.requests):
            reply, seconds = chat(base, args.name)
            usage = reply.get("usage") or {}
            calls = (reply["choices"][0]["message"].get("tool_calls")) or []
            rows.append((seconds, usage, bool(calls)))
    finally:
        server.stop()
    lines = header(
        f"A served model on this node: {args.engine} {args.model}",
        f"GPUs: {'; '.join(found) or 'none'}. Server up in {started:.1f} s.",
    )
    lines += [
        "| request | seconds | prompt tokens | completion tokens | completion tokens/s | "
        "tool call |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for i, (seconds, usage, called) in enumerate(rows, 1):
        out = usage.get("completion_tokens", 0)
        lines.append(
            f"| {i} | {seconds:.2f} | {usage.get('prompt_tokens', 0)} | {out} | "
            f"{out / seconds:.1f} | {'yes' if called else 'no'} |"
        )
    print("\n".join(lines))
    append_results(lines)


if __name__ == "__main__":
    main()
