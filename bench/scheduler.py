"""Scheduler efficiency against its lower bound, and throughput on 1 against 2 simulated nodes.

830 synthetic queries (the sample's questions, cycled) run on Ray against the offline provider
with the `offline/long-horizon` policy, which makes 10-40 tool calls per query (uniform, fixed
by the question) over the real tools and index. Model latency is log-normal with a mean of
2 s x `--scale` (time-scaled so that a scenario takes minutes). For each scenario:

    lower bound = max(sum of per-query work / query slots, requests / RPM, tokens / TPM,
                      longest query)
    efficiency  = lower bound / measured makespan

- per-query work: the query's wall time minus its waits for the rate limiter and back-offs
  (what a query costs with an idle provider), from its record;
- query slots: replicas x `runtime.max_concurrency`;
- requests / tokens: the successful calls and their prompt + completion tokens (429s are free);
- makespan: first query start to last query end (Ray start and replica warm-up are excluded and
  reported apart, as "setup").

Scenarios: `free` (1 node, no quotas); `nodes` (`free` on 2 simulated nodes of
`ray.cluster_utils.Cluster`, compared with `free` for throughput); `requests` and `tokens` (1
node, an RPM or a TPM quota that binds: its bound is 1.25x the `free` run's work bound). Nodes
are simulated on one machine: each has 1 CPU and one replica; the head (driver, offline
provider, limiter) has none.

    python bench/scheduler.py                      # all four, appends to bench/RESULTS.md
    python bench/scheduler.py --queries 100 --scenarios free   # a quick pilot
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import orjson

from piserini_ray.engines.ray.ray_env import prepare_local_ray

prepare_local_ray()  # before Ray is imported

import ray  # noqa: E402
from _common import append_results, cycled_queries, cycled_sample, header  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from piserini_ray.config import load_config  # noqa: E402
from piserini_ray.offline.long_horizon import planned_calls  # noqa: E402
from piserini_ray.pipeline import run_on_ray  # noqa: E402
from piserini_ray.records import QueryRecord  # noqa: E402

OUT = Path(__file__).parent / "out" / "scheduler"
MEAN_LATENCY = 2.0  # seconds per model call before scaling (the latency model)


@dataclass
class Outcome:
    scenario: str
    nodes: int
    slots: int
    queries: int
    requests: int
    tokens: int
    makespan: float
    setup: float
    work_bound: float
    rpm_bound: float
    tpm_bound: float
    longest: float
    cpu_percent: float
    rate_limited: int

    @property
    def bound(self) -> float:
        return max(self.work_bound, self.rpm_bound, self.tpm_bound, self.longest)

    @property
    def efficiency(self) -> float:
        return self.bound / self.makespan

    @property
    def binding(self) -> str:
        terms = {
            "work/slots": self.work_bound,
            "requests/RPM": self.rpm_bound,
            "tokens/TPM": self.tpm_bound,
            "longest query": self.longest,
        }
        return max(terms, key=lambda k: terms[k])

    @property
    def throughput(self) -> float:
        return self.queries / self.makespan * 60


def write_queries(folder: Path, count: int) -> tuple[Path, int]:
    """`count` queries cycling the sample's questions; returns the config and planned requests."""
    config = cycled_sample(folder, count, "scheduler-bench", "s", model="offline/long-horizon")
    requests = sum(planned_calls(q["query"]) + 1 for q in cycled_queries(count, "s"))
    return config, requests  # each query: its planned tool calls, then the answer


def run_scenario(
    name: str,
    config_path: Path,
    nodes: int,
    slots_per_node: int,
    scale: float,
    rpm: int | None = None,
    tpm: int | None = None,
) -> Outcome:
    run_dir = OUT / f"{name}-{int(time.time())}"
    started = time.time()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": 2**27},
    )
    for _ in range(nodes):
        cluster.add_node(num_cpus=1, object_store_memory=2**27)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    overrides = {
        "offline.latency": {"kind": "lognormal", "seconds": MEAN_LATENCY * scale, "sigma": 0.5},
        "runtime.address": cluster.address,
        "runtime.replicas": nodes,
        "runtime.cpus_per_replica": 1,
        "runtime.max_concurrency": slots_per_node,
        "runtime.placement": "spread",
    }
    if rpm or tpm:  # the provider enforces the quota, the limiter is told the same numbers
        quota = {"requests_per_minute": rpm, "tokens_per_minute": tpm}
        overrides |= {"offline.quotas": quota, "model.rate_limit": quota}
    config = load_config(config_path, overrides)
    busy_before, total_before = _cpu_busy()
    try:
        run_on_ray([(config, run_dir)], lambda m: print(m, file=sys.stderr))
    finally:
        busy, total = _cpu_busy()
        cpu_percent = 100 * (busy - busy_before) / (total - total_before)
        ray.shutdown()
        cluster.shutdown()
    records = [
        QueryRecord.model_validate(orjson.loads(x))
        for x in (run_dir / "records.jsonl").read_bytes().splitlines()
    ]
    starts = [datetime.fromisoformat(r.started_at).timestamp() for r in records]
    ends = [datetime.fromisoformat(r.finished_at).timestamp() for r in records]
    makespan = max(ends) - min(starts)
    work = [r.wall_seconds - r.waited_seconds for r in records]
    requests = sum(len(r.trajectory) for r in records)
    tokens = sum(r.usage.input_tokens + r.usage.output_tokens for r in records)
    quota_window = 60.0
    return Outcome(
        scenario=name,
        nodes=nodes,
        slots=nodes * slots_per_node,
        queries=len(records),
        requests=requests,
        tokens=tokens,
        makespan=makespan,
        setup=min(starts) - started,
        work_bound=sum(work) / (nodes * slots_per_node),
        rpm_bound=requests / rpm * quota_window if rpm else 0.0,
        tpm_bound=tokens / tpm * quota_window if tpm else 0.0,
        longest=max(work),
        cpu_percent=cpu_percent,
        rate_limited=sum(
            1 for r in records for t in r.trajectory for x in t.retries if "rate" in x
        ),
    )


def _cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat: Ray's processes are not all
    our descendants, and the machine runs nothing else during a bench."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=830)
    parser.add_argument("--scale", type=float, default=0.25, help="latency time scale")
    parser.add_argument("--slots", type=int, default=24, help="queries at once per node")
    parser.add_argument("--scenarios", default="free,nodes,requests,tokens")
    parser.add_argument("--no-record", action="store_true", help="print, do not append")
    args = parser.parse_args()
    config_path, planned = write_queries(OUT / f"queries-{args.queries}", args.queries)
    scenarios = args.scenarios.split(",")
    outcomes: list[Outcome] = []
    if "tokens" in scenarios and "free" not in scenarios[: scenarios.index("tokens")]:
        parser.error("the tokens scenario takes its TPM from a free run: list free before it")
    # The quota scenarios set RPM (or TPM) so that requests / RPM (or tokens / TPM) is 1.25x the
    # work bound: from the `free` run's measured figures when it ran first, else from the plan
    # (RPM only: tokens are not known before a run).
    expected_work = planned * MEAN_LATENCY * args.scale / args.slots
    rpm = int(planned / (1.25 * expected_work / 60))
    tpm: int | None = None
    quotas: list[str] = []
    for name in scenarios:
        outcome = run_scenario(
            name,
            config_path,
            nodes=2 if name == "nodes" else 1,
            slots_per_node=args.slots,
            scale=args.scale,
            rpm=rpm if name == "requests" else None,
            tpm=tpm if name == "tokens" else None,
        )
        outcomes.append(outcome)
        print(outcome, file=sys.stderr)
        if name == "free":
            rpm = int(outcome.requests / (1.25 * outcome.work_bound / 60))
            tpm = int(outcome.tokens / (1.25 * outcome.work_bound / 60))
        if name == "requests":
            quotas.append(f"{rpm:,} RPM in `requests`")
        if name == "tokens":
            quotas.append(f"{tpm:,} TPM in `tokens`")
    lines = [
        *header(
            "Scheduler efficiency",
            f"{args.queries} queries of `offline/long-horizon` (10-40 tool calls each), "
            f"log-normal latency mean {MEAN_LATENCY * args.scale:.2f} s (2 s x {args.scale}), "
            f"{args.slots} queries at once per node"
            + (f"; quotas: {', '.join(quotas)}." if quotas else "."),
        ),
        "| scenario | nodes | slots | requests | makespan s | bound s (binding term) | "
        "efficiency | goal >= 0.95 | queries/min | machine CPU % | setup s | 429s |",
        "|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        # The efficiency goal is for one node with and without quotas; `nodes` has the
        # throughput goal below.
        met = "-" if o.scenario == "nodes" else "met" if o.efficiency >= 0.95 else "MISSED"
        lines.append(
            f"| {o.scenario} | {o.nodes} | {o.slots} | {o.requests:,} | {o.makespan:.1f} | "
            f"{o.bound:.1f} ({o.binding}) | {o.efficiency:.3f} | {met} | "
            f"{o.throughput:.1f} | {o.cpu_percent:.0f} | {o.setup:.1f} | {o.rate_limited} |"
        )
    by_name = {o.scenario: o for o in outcomes}
    if "free" in by_name and "nodes" in by_name:
        ratio = by_name["nodes"].throughput / by_name["free"].throughput
        lines += [
            "",
            f"2 nodes / 1 node throughput (quotas not binding): {ratio:.2f}x "
            f"(goal >= 1.8x: {'met' if ratio >= 1.8 else 'MISSED'}).",
        ]
    per_query = statistics.mean(o.requests / o.queries for o in outcomes)
    lines += ["", f"Mean requests per query: {per_query:.1f}.", ""]
    if args.no_record:
        print("\n".join(lines))
    else:
        append_results(lines)


if __name__ == "__main__":
    main()
