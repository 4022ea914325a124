"""The same queries at the standard, flex and batch tiers, against the offline provider: the
long-horizon agent (about 25 turns a query) behind `gpt-5` on OpenAI's Chat Completions route and
behind `claude-haiku-4.5` on Anthropic's Messages route (its batches: Message Batches, with and
without the 1-hour cache), the local engine, turns counted by iterations (a batch queues, so a
clock means nothing). Per tier: the run's cost, the emulator's bill at that tier (its own usage
log priced with the same table), the makespan, the batches sent, and whether every query's
trajectory (tool calls, answer) and recall equal the standard tier's. Then the batch judge
against the standard judge on the standard run's answers: verdicts and the judge's bill.

    python bench/service_tiers.py [--queries 10] [--batch-seconds 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

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


#: The routes the bench drives: the name in the pricing table, the litellm route, the model's
#: name on that route (the emulator's alias) and the model settings every tier shares.
ROUTES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt-5": ("openai/gpt-5", "gpt-5", {}),
    # Caching off at both tiers, to compare like with like; the third row turns it on.
    "claude-haiku-4.5": (
        "anthropic/claude-haiku-4-5",
        "claude-haiku-4-5",
        {"max_output_tokens": 4096, "prompt_caching": "off"},
    ),
}
#: (route, tier, prompt caching on) of each row.
CASES: list[tuple[str, ServiceTier, bool]] = [
    *(("gpt-5", tier, False) for tier in TIERS),
    ("claude-haiku-4.5", "standard", False),
    ("claude-haiku-4.5", "batch", False),
    ("claude-haiku-4.5", "batch", True),  # Anthropic's 1-hour cache marks in each batch
]


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
            "(Chat Completions) and `anthropic/claude-haiku-4-5` (Messages, Message Batches), "
            "the local engine, 40 turns at most, the table's prices, each emulated batch "
            f"queued {args.batch_seconds:g} s.",
        ),
        "| model | tier | queries | turns / query | trajectories as standard | accuracy "
        "| surfaced recall | cost (run) | bill (emulator) | cost / standard | batches "
        "| makespan |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    baselines: dict[str, tuple[dict[str, bytes], float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tier, cached in CASES:
            route, on_route, settings = ROUTES[name]
            served = OfflineConfig(
                model_aliases={on_route: "offline/long-horizon"},
                batch=BatchConfig(completion_seconds=args.batch_seconds),
            )
            with OfflineProvider(served) as provider:
                base = provider.base_url
                model = {"name": name, "litellm_model": route, "service_tier": tier,
                         "call_timeout": 180, **settings}  # fmt: skip
                # litellm's Anthropic route adds /v1/messages to the host itself.
                model["api_base"] = base.removesuffix("/v1") if "anthropic" in route else base
                if cached:
                    model["prompt_caching"] = "auto"
                config = load_config(
                    None,
                    {
                        "slice.sample": args.queries,
                        "model": model,
                        "agent": {"termination": "iterations", "max_iterations": 40},
                        "runtime.batch": {"gather_seconds": 0.5, "poll_seconds": 0.2},
                        "judge.model": {"name": "offline/exact-match-judge"},
                        "retrieval.index_root": str(Path(tmp) / "indexes"),
                    },
                )
                run_dir = Path(tmp) / f"{name}-{tier}-{cached}"
                started = time.monotonic()
                summary = run_local(config, run_dir, concurrency=4, log=lambda _m: None)
                makespan = time.monotonic() - started
                billed = bill_usage(provider.bill.get((tier, on_route)))
                batches = len({r.batch_id for r in provider.requests if r.batch_id})
            metrics = finish(config, run_dir, lambda _m: None)
            price = pricing.price(name, tier)
            assert price is not None and metrics.cost_usd is not None
            trajectories = _trajectories(run_dir, config)
            baseline, standard_cost = baselines.setdefault(name, (trajectories, metrics.cost_usd))
            turns = sum(len(orjson.loads(t)) - 1 for t in trajectories.values())
            lines.append(
                f"| {name} | {tier}{' + 1 h cache' if cached else ''} | {summary.queries} "
                f"| {turns / max(1, len(trajectories)):.1f} "
                f"| {'yes' if trajectories == baseline else 'NO'} "
                f"| {100 * (metrics.accuracy.value or 0):.1f} % "
                f"| {100 * (metrics.recall['surfaced']['evidence'].macro.value or 0):.1f} % "
                f"| ${metrics.cost_usd:.4f} | ${price.cost(billed):.4f} "
                f"| {metrics.cost_usd / standard_cost:.3f} | {batches} | {makespan:.1f} s |"
            )
        lines += _judges(Path(tmp) / "gpt-5-standard-False", args, pricing)
    lines.append(
        "\nThe bill is the run's cost plus the one-word model check before each run (no query "
        "holds it; at the batch tier the check is a standard call, billed apart). The first "
        "row's makespan includes building the sample's index. The offline provider answers "
        "flex as fast as standard, so only the batch tier's makespan says something: its "
        "turns wait for their batch. With the 1-hour cache, each turn of a query reads the "
        "prefix its turn before wrote (in the batch before)."
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
