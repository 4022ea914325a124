"""The same queries at the standard and the flex tier, against the offline provider: the
long-horizon agent (about 25 turns a query) behind `gpt-5` on OpenAI's Chat Completions route,
in this process (the local engine). Per tier: the run's cost, the emulator's bill at that tier
(its own usage log priced with the same table), the makespan, and whether every query's
trajectory (tool calls, answer) and recall are the same as at the standard tier.

    python bench/service_tiers.py [--queries 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson
from _common import append_results, header

from piserini_ray.config import load_config
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.pipeline import finish, run_local
from piserini_ray.records import Usage
from piserini_ray.store import RunStore


def _trajectories(run_dir: Path, config) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
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
    args = parser.parse_args()
    pricing = load_pricing()
    lines = [
        *header(
            "Service tiers: the same run at the standard and the flex tier",
            f"{args.queries} sample queries (seeded), offline/long-horizon behind `openai/gpt-5` "
            "(Chat Completions), the local engine, gpt-5's table prices.",
        ),
        "| tier | queries | turns | trajectories as standard | accuracy | surfaced recall "
        "| cost (run) | bill (emulator) | cost / standard | makespan |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    baseline: dict[str, bytes] = {}
    standard_cost = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for tier in ("standard", "flex"):
            served = OfflineConfig(model_aliases={"gpt-5": "offline/long-horizon"})
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
                        "judge.model": {"name": "offline/exact-match-judge"},
                        "retrieval.index_root": str(Path(tmp) / "indexes"),
                    },
                )
                run_dir = Path(tmp) / tier
                started = time.monotonic()
                summary = run_local(config, run_dir, concurrency=4, log=lambda _m: None)
                makespan = time.monotonic() - started
                bill = provider.bill
            metrics = finish(config, run_dir, lambda _m: None)
            price = pricing.price("gpt-5", tier)
            assert price is not None and metrics.cost_usd is not None
            billed = sum(
                price.cost(
                    Usage(
                        input_tokens=line.prompt_tokens,
                        cached_tokens=line.cached_tokens,
                        output_tokens=line.completion_tokens,
                    )
                )
                for (billed_tier, _model), line in bill.items()
                if billed_tier == tier
            )
            trajectories = _trajectories(run_dir, config)
            baseline = baseline or trajectories
            standard_cost = standard_cost or metrics.cost_usd
            same = "yes" if trajectories == baseline else "NO"
            records_turns = sum(len(orjson.loads(t)) - 1 for t in trajectories.values()) / max(
                1, len(trajectories)
            )
            lines.append(
                f"| {tier} | {summary.queries} | {records_turns:.1f} | {same} "
                f"| {100 * (metrics.accuracy.value or 0):.1f} % "
                f"| {100 * (metrics.recall['surfaced']['evidence'].macro.value or 0):.1f} % "
                f"| ${metrics.cost_usd:.4f} | ${billed:.4f} "
                f"| {metrics.cost_usd / standard_cost:.3f} | {makespan:.1f} s |"
            )
    append_results(lines)


if __name__ == "__main__":
    main()
