"""Agent-run figures on the embedded sample with the offline heuristic model:

- per-turn framework overhead: charged time of a turn that is neither model nor tool time
  (p50, p99; goal p50 <= 5 ms);
- the cached-token ratio the prefix-caching offline provider reports (goal >= 90 %), for the
  heuristic (about 8 tool calls per query) and for `offline/long-horizon` (10-40, the paper's
  range: its conversations have the paper's shape);
- resume: a run directory holding 820 of 830 records; the time from Ray being up to the first
  new query starting (goal <= 10 s), and that exactly 10 run.

    python bench/agent_run.py          # appends its table to bench/RESULTS.md
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import orjson
from _common import append_results, cycled_sample, header, percentile

from piserini_ray.config import load_config
from piserini_ray.pipeline import run_local
from piserini_ray.records import QueryRecord

OUT = Path(__file__).parent / "out"


def turn_overheads(records: list[QueryRecord]) -> list[float]:
    """Charged seconds of each turn minus its model and tool seconds."""
    overheads = []
    for record in records:
        turns = record.trajectory
        for i, turn in enumerate(turns):
            end = turns[i + 1].started_at_charged if i + 1 < len(turns) else record.charged_seconds
            tools = sum(c.seconds for c in turn.tool_calls)
            overheads.append(end - turn.started_at_charged - turn.model_seconds - tools)
    return overheads


def resume_bench(folder: Path) -> tuple[float, int]:
    """830 queries (the sample's questions, cycled) with 820 recorded, then resume on Ray."""
    config = load_config(cycled_sample(folder, 830, "resume830", "r"))
    base, run_dir = folder / "complete", folder / f"run-{int(time.time())}"
    if not (base / "records.jsonl").exists():  # the 830-query run, made once
        run_local(config, base, concurrency=8, log=lambda _m: None)
    shutil.copytree(base, run_dir)
    lines = (run_dir / "records.jsonl").read_bytes().splitlines(keepends=True)
    (run_dir / "records.jsonl").write_bytes(b"".join(lines[:820]))  # drop the last 10
    before = len((run_dir / "records.jsonl").read_bytes().splitlines())
    command = [sys.executable, "-m", "piserini_ray.cli", "resume", str(run_dir)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    ray_up = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if ray_up is None and "local Ray instance" in line:
            ray_up = time.time()
    proc.wait()
    records = [orjson.loads(x) for x in (run_dir / "records.jsonl").read_bytes().splitlines()]
    new = records[before:]
    first = min(datetime.fromisoformat(r["started_at"]).timestamp() for r in new)
    return first - (ray_up or first), len(new)


def sample_run(model: str) -> list[QueryRecord]:
    run_dir = OUT / f"agent-run-{model.replace('/', '-')}-{int(time.time())}"
    run_local(load_config(None, {"model.name": model}), run_dir, concurrency=8, log=lambda _m: None)
    return [
        QueryRecord.model_validate(orjson.loads(x))
        for x in (run_dir / "records.jsonl").read_bytes().splitlines()
    ]


def cached_ratio(records: list[QueryRecord]) -> float:
    return sum(r.usage.cached_tokens for r in records) / sum(r.usage.input_tokens for r in records)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    records = sample_run("offline/heuristic")
    overhead = [1000 * x for x in turn_overheads(records)]
    ratio = cached_ratio(records)
    long_records = sample_run("offline/long-horizon")
    long_ratio = cached_ratio(long_records)
    calls, long_calls = (
        statistics.mean(sum(r.tool_call_counts.values()) for r in rs)
        for rs in (records, long_records)
    )
    resume_seconds, resumed = resume_bench(OUT / "resume")
    p50 = statistics.median(overhead)
    rows = [
        ("per-turn overhead p50", f"{p50:.2f} ms", "<= 5 ms", p50 <= 5),
        ("per-turn overhead p99", f"{percentile(overhead, 0.99):.2f} ms", "-", None),
        (
            f"cached-token ratio, offline/heuristic ({calls:.1f} tool calls per query)",
            f"{100 * ratio:.1f} %",
            ">= 90 %",
            ratio >= 0.9,
        ),
        (
            f"cached-token ratio, offline/long-horizon ({long_calls:.1f} tool calls per query)",
            f"{100 * long_ratio:.1f} %",
            ">= 90 %",
            long_ratio >= 0.9,
        ),
        (
            "resume 820/830: Ray up -> first new query",
            f"{resume_seconds:.2f} s",
            "<= 10 s",
            resume_seconds <= 10,
        ),
        ("resume 820/830: queries run", str(resumed), "exactly 10", resumed == 10),
    ]
    lines = [
        *header("Agent run figures", f"{len(records)} queries, {len(overhead)} turns."),
        "| figure | measured | goal | met |",
        "|---|---:|---|---|",
        *[
            f"| {name} | {value} | {goal} | {'-' if ok is None else ('met' if ok else 'MISSED')} |"
            for name, value, goal, ok in rows
        ],
    ]
    append_results(lines)


if __name__ == "__main__":
    main()
