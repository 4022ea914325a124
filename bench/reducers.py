"""Reducers at the paper's shape: judge-less report (metrics map step, aggregate, files) of a
synthetic run of 830 queries, ~25 turns and ~12 searches of 1,000 hits each.

    python bench/reducers.py [--queries 830 --turns 25 --searches 12]

Writes the run once under bench/out/reducers-<shape>/ (a rerun reuses it), then measures each
step in a fresh process (peak memory is the process's own, from getrusage): importing the run
store, reading every record, the report (`piserini-ray report`'s path: the streaming map step
in the driver, the aggregate, summary.json, report.md, plots, report.html), and prints the table.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import orjson
from _common import append_results, cycled_sample, header

from piserini_ray.config import load_config
from piserini_ray.records import (
    Judgement,
    QueryRecord,
    RankingLog,
    ToolCallRecord,
    Turn,
    Usage,
    now_iso,
)

OUT = Path(__file__).parent / "out"
#: About what one observation of the three tools holds (a page of hits with excerpts, or a
#: document slice of 200 lines).
OBSERVATION_CHARS = 9_000


def write_run(folder: Path, queries: int, turns: int, searches: int) -> tuple[Path, Path]:
    """The run directory and its config; written once per shape."""
    from piserini_ray.store import RunStore

    config_path = cycled_sample(folder / "bench", queries, "reducers", "r")
    run_dir = folder / "run"
    if (run_dir / "summary.done").exists():
        return config_path, run_dir
    config = load_config(config_path)
    docids = [
        orjson.loads(line)["docid"]
        for line in Path(config.benchmark.corpus or "").read_bytes().splitlines()
    ]
    rng = random.Random(7)
    with RunStore(run_dir, config, log=lambda _m: None) as store:
        judge = config.judge_model().name
        for q in [
            orjson.loads(x) for x in (folder / "bench" / "queries.jsonl").read_bytes().splitlines()
        ]:
            rankings = [
                RankingLog(
                    search_id=f"s{i + 1}", query=f"search {i}", docids=rng.sample(docids, 1000)
                )
                for i in range(searches)
            ]
            trajectory = [
                Turn(
                    index=t + 1,
                    model_output=None,
                    tool_calls=[
                        ToolCallRecord(
                            id=f"c{t}",
                            name="search" if t < searches else "read_document",
                            arguments='{"reason": "r", "query": "q"}',
                            ok=True,
                            observation="x" * OBSERVATION_CHARS,
                            seconds=0.01,
                        )
                    ],
                    usage=Usage(
                        input_tokens=20_000 + 1_000 * t, output_tokens=150, cached_tokens=18_000
                    ),
                )
                for t in range(turns)
            ]
            store.append(
                QueryRecord(
                    run_id=store.run_id,
                    config_hash=store.config_hash,
                    query_id=q["query_id"],
                    model=config.model.name,
                    status="completed",
                    final_answer=f"Exact Answer: {q['answer']}\nConfidence: 80%",
                    exact_answer=q["answer"],
                    confidence=80,
                    trajectory=trajectory,
                    usage=sum((t.usage for t in trajectory), Usage()),
                    surfaced=sorted({d for r in rankings for d in r.docids}),
                    previewed=rankings[0].docids[:5],
                    opened=rankings[0].docids[:2],
                    behavior=rankings[0].docids[:2],
                    tool_call_counts={"search": searches, "read_document": turns - searches},
                    rankings=rankings,
                    started_at=now_iso(),
                    finished_at=now_iso(),
                )
            )
            store.append_judgement(
                Judgement(
                    query_id=q["query_id"],
                    judge_model=judge,
                    status="judged",
                    correct=rng.random() < 0.5,
                    confidence=90.0,
                    reasoning="r",
                    correct_answer="a",
                )
            )
    (run_dir / "summary.done").write_text("")
    return config_path, run_dir


def measure(step: str, run_dir: Path) -> dict[str, float]:
    """One step in this (fresh) process: seconds and peak resident memory."""
    started = time.perf_counter()
    if step == "import-store":  # this script imported records already: time a clean process
        code = "import time; t = time.perf_counter(); import piserini_ray.store; "
        code += "print(time.perf_counter() - t)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        return {"seconds": float(out.stdout), "peak_bytes": 0.0}
    else:
        from piserini_ray.cli import _manifest_config
        from piserini_ray.store import RunStore

        config = _manifest_config(run_dir)
        if step == "read-records":
            with RunStore(run_dir, config, log=lambda _m: None) as store:
                sum(1 for _ in store.iter_records(rankings=True))
        elif step == "report":
            from piserini_ray.pipeline import finish

            finish(config, run_dir, lambda _m: None, judge=False)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "peak_bytes": peak}


def _in_fresh_process(step: str, run_dir: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--measure", step, str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    return orjson.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=830)
    parser.add_argument("--turns", type=int, default=25)
    parser.add_argument("--searches", type=int, default=12)
    parser.add_argument("--measure", nargs=2, metavar=("STEP", "RUN_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(orjson.dumps(measure(args.measure[0], Path(args.measure[1]))).decode())
        return
    folder = OUT / f"reducers-{args.queries}x{args.turns}x{args.searches}"
    _, run_dir = write_run(folder, args.queries, args.turns, args.searches)
    size = sum(p.stat().st_size for p in run_dir.rglob("*.jsonl"))
    lines = header(
        "Reducers at the paper's shape",
        f"{args.queries} queries, {args.turns} turns, {args.searches} searches of 1,000 hits; "
        f"the run's JSONL files: {size / 2**20:,.0f} MiB.",
    )
    lines += [
        "| step | seconds | peak memory (MiB) | peak / run files | goal | |",
        "|---|---|---|---|---|---|",
    ]
    goals = {
        "import-store": ("no litellm", None),
        "read-records": ("one pass", None),
        "report": ("peak <= 1.5x the run's files", 1.5),
    }
    for step, (goal, ratio) in goals.items():
        found = _in_fresh_process(step, run_dir)
        share = found["peak_bytes"] / size
        verdict = "" if ratio is None else ("met" if share <= ratio else "MISSED")
        peak = f"{found['peak_bytes'] / 2**20:,.0f}" if found["peak_bytes"] else "-"
        lines.append(
            f"| {step} | {found['seconds']:.2f} | {peak} | {share:.2f}x | {goal} | {verdict} |"
        )
    importing = subprocess.run(
        [sys.executable, "-c", "import piserini_ray.store, sys; print('litellm' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    lines.append("")
    lines.append(f"Importing the store loads litellm: {importing}.")
    append_results(lines)


if __name__ == "__main__":
    main()
