"""The same queries at the standard, flex and batch tiers, against the offline provider: the
long-horizon agent (about 25 turns a query) behind `gpt-5` on OpenAI's Chat Completions route,
the local engine, turns counted by iterations (a batch queues, so a clock means nothing). Per
tier: the run's cost, the emulator's bill at that tier (its own usage log priced with the same
table), the makespan, the batches sent, and whether every query's trajectory (tool calls,
answer) and recall equal the standard tier's. Then the batch judge against the standard judge
on the standard run's answers: verdicts and the judge's bill.

    python bench/service_tiers.py [--queries 10] [--batch-seconds 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson
from _common import append_results, bill_usage, header

from piserini_ray.config import RunConfig, load_config
from piserini_ray.config.offline import BatchConfig
from piserini_ray.metrics.cost import PricingTable, ServiceTier, load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.pipeline import finish, run_local
from piserini_ray.store import RunStore, manifest_config

TIERS: tuple[ServiceTier, ...] = ("standard", "flex", "batch")


def _trajectories(run_dir: Path, config: RunConfig) -> dict[str, bytes]:
    """Each query's tool calls and answer, as bytes to compare."""
    with RunStore(run_dir, config) as store:
        return {
            r.query_id: orjson.dumps(
                [[(c.name, c.arguments) for c in t.tool_calls] for t in r.trajectory]
                + [r.final_answer]
            )
            for r in store.records()
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", type=int, default=10)
    parser.add_argument("--batch-seconds", type=float, default=1.0)
    args = parser.parse_args()
    pricing = load_pricing()
    lines = [
        *header(
            "Service tiers: the same run at the standard, flex and batch tiers",
            f"{args.queries} sample queries (seeded), offline/long-horizon behind `openai/gpt-5` "
            "(Chat Completions), the local engine, 40 turns at most, gpt-5's table prices, each "
            f"emulated batch queued {args.batch_seconds:g} s.",
        ),
        "| tier | queries | turns / query | trajectories as standard | accuracy | surfaced recall "
        "| cost (run) | bill (emulator) | cost / standard | batches | makespan |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    baseline: dict[str, bytes] = {}
    standard_cost = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for tier in TIERS:
            served = OfflineConfig(
                model_aliases={"gpt-5": "offline/long-horizon"},
                batch=BatchConfig(completion_seconds=args.batch_seconds),
            )
            with OfflineProvider(served) as provider:
                config = load_config(
                    None,
                    {
                        "slice.sample": args.queries,
                        "model": {
                            "name": "gpt-5",
                            "litellm_model": "openai/gpt-5",
                            "api_base": provider.base_url,
                            "service_tier": tier,
                            "call_timeout": 180,
                        },
                        "agent": {"termination": "iterations", "max_iterations": 40},
                        "runtime.batch": {"gather_seconds": 0.5, "poll_seconds": 0.2},
                        "judge.model": {"name": "offline/exact-match-judge"},
                        "retrieval.index_root": str(Path(tmp) / "indexes"),
                    },
                )
                run_dir = Path(tmp) / tier
                started = time.monotonic()
                summary = run_local(config, run_dir, concurrency=4, log=lambda _m: None)
                makespan = time.monotonic() - started
                billed = bill_usage(provider.bill.get((tier, "gpt-5")))
                batches = len({r.batch_id for r in provider.requests if r.batch_id})
            metrics = finish(config, run_dir, lambda _m: None)
            price = pricing.price("gpt-5", tier)
            assert price is not None and metrics.cost_usd is not None
            trajectories = _trajectories(run_dir, config)
            baseline = baseline or trajectories
            standard_cost = standard_cost or metrics.cost_usd
            turns = sum(len(orjson.loads(t)) - 1 for t in trajectories.values())
            lines.append(
                f"| {tier} | {summary.queries} | {turns / max(1, len(trajectories)):.1f} "
                f"| {'yes' if trajectories == baseline else 'NO'} "
                f"| {100 * (metrics.accuracy.value or 0):.1f} % "
                f"| {100 * (metrics.recall['surfaced']['evidence'].macro.value or 0):.1f} % "
                f"| ${metrics.cost_usd:.4f} | ${price.cost(billed):.4f} "
                f"| {metrics.cost_usd / standard_cost:.3f} | {batches} | {makespan:.1f} s |"
            )
        lines += _judges(Path(tmp) / "standard", args, pricing)
    lines.append(
        "\nThe bill is the run's cost plus the one-word model check before each run (no query "
        "holds it; at the batch tier the check is a standard call, billed apart). The first "
        "tier's makespan includes building the sample's index. The offline provider answers "
        "flex as fast as standard, so only the batch tier's makespan says something: its "
        "turns wait for their batch."
    )
    append_results(lines)


def _judges(run_dir: Path, args: argparse.Namespace, pricing: PricingTable) -> list[str]:
    """The standard run's answers judged by `gpt-5` (the exact-match judge behind it) at the
    standard and at the batch tier, each in a copy of the run."""
    import shutil

    rows = [
        "",
        "| judge tier | verdicts | correct | same verdicts as standard | judge cost (run) "
        "| judge bill (emulator) | batches |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    verdicts: dict[str, dict[str, bool]] = {}
    judge_tiers: tuple[ServiceTier, ...] = ("standard", "batch")
    for tier in judge_tiers:
        served = OfflineConfig(
            model_aliases={"gpt-5": "offline/exact-match-judge"},
            batch=BatchConfig(completion_seconds=args.batch_seconds),
        )
        copy = run_dir.parent / f"judged-{tier}"
        shutil.copytree(run_dir, copy)
        shutil.rmtree(copy / "judgements")
        with OfflineProvider(served) as provider:
            judge = {"name": "gpt-5", "api_base": provider.base_url, "service_tier": tier}
            config = RunConfig.model_validate(
                manifest_config(copy).model_dump(mode="json")
                | {"judge": {"model": judge, "batch_poll_seconds": 0.2}}
            )
            metrics = finish(config, copy, lambda _m: None)
            billed = bill_usage(provider.bill.get((tier, "gpt-5")))
            batches = len({r.batch_id for r in provider.requests if r.batch_id})
        with RunStore(copy, config) as store:
            verdicts[tier] = {q: bool(j.correct) for q, j in store.judgements("gpt-5").items()}
        price = pricing.price("gpt-5", tier)
        assert price is not None
        rows.append(
            f"| {tier} | {len(verdicts[tier])} | {sum(verdicts[tier].values())} "
            f"| {'yes' if verdicts[tier] == verdicts['standard'] else 'NO'} "
            f"| ${metrics.judge_cost_usd or 0:.4f} | ${price.cost(billed):.4f} | {batches} |"
        )
    return rows


if __name__ == "__main__":
    main()
