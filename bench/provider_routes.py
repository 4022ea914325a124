"""Each provider's native route end to end on Ray, against the offline provider's emulators:
the sample through litellm's `anthropic/`, `deepseek/` and `openai/` routes (thinking or
reasoning on; OpenAI's Chat Completions for gpt-5, its Responses API for gpt-5.4-mini), and
per route the cached-token ratio and cost as the run recorded them against the emulator's own
bill (its usage log priced with the same table).

    python bench/provider_routes.py [--queries 20]
    python bench/provider_routes.py --cut [--queries 10]

The one-word model check before each run is on the bill too (it is real spending); it is shown
apart, since no query's record holds it.

`--cut` gives every answer a fixed latency (`--latency`, 1.2 s) and each query a budget it
cannot finish in (`--budget`, 3 s), so calls are cut in flight: the run counts each cut call's
prompt as an estimate, and the emulator bills the prompt of each request whose client left.
The table shows both, per route, and the whole cost on either side.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson
from _common import append_results, bill_usage, header

from piserini_ray.config import RunConfig, load_config
from piserini_ray.config.offline import LatencyConfig
from piserini_ray.llm.check import PROMPT
from piserini_ray.metrics.cost import Price, load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.pipeline import run_on_ray
from piserini_ray.records import QueryRecord, Usage
from piserini_ray.store import RunStore

ROUTES = {  # price-table name: (litellm route, api_base suffix, extra model settings)
    "claude-haiku-4.5": ("anthropic/claude-haiku-4-5", "", {"max_output_tokens": 4096}),
    "deepseek-v4-flash": ("deepseek/deepseek-v4-flash", "/deepseek", {}),
    # Chat Completions for gpt-5; litellm 1.106.2 sends gpt-5.4+ with function tools and a
    # reasoning effort to OpenAI's Responses API (`/v1/responses`, its chat-to-responses bridge).
    "gpt-5": ("openai/gpt-5", "/v1", {}),
    "gpt-5.4-mini": ("openai/gpt-5.4-mini", "/v1", {}),
}


def _is_check(messages: object) -> bool:
    """The one-word model check, in whichever wire format the route sent it."""
    return str(PROMPT[0]["content"]) in orjson.dumps(messages).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--cut", action="store_true", help="cut calls at the budget")
    parser.add_argument("--budget", type=float, default=3.0)
    parser.add_argument("--latency", type=float, default=1.2)
    args = parser.parse_args()
    if args.cut:
        cut_calls(args.queries, args.budget, args.latency)
        return
    aliases = {route.split("/", 1)[1]: "offline/heuristic" for route, _, _ in ROUTES.values()}
    pricing = load_pricing()
    lines = [
        *header(
            "Provider routes on Ray against their emulators",
            f"{args.queries} sample queries (seeded), offline/heuristic "
            "behind each route, reasoning_effort low.",
        ),
        "| route | queries | cached ratio (run) | cached ratio (bill) | cost (run) | cost (bill) "
        "| check request |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    config = OfflineConfig(model_aliases=aliases, request_log=100_000)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (route, _, _) in ROUTES.items():
            with OfflineProvider(config) as provider:
                _, records = _run(provider, name, args.queries, Path(tmp), {})
            price = pricing.price(name)
            assert price is not None
            ours = sum((r.usage for r in records), Usage())
            bill, check_cost = _billed(provider, name), _check_cost(provider, price)
            bill_cost = price.cost(bill) - check_cost
            ratio, billed_ratio = (u.cached_tokens / max(1, u.input_tokens) for u in (ours, bill))
            lines.append(
                f"| `{route}` | {len(records)} | {100 * ratio:.1f} % | "
                f"{100 * billed_ratio:.1f} % | ${price.cost(ours):.4f} | ${bill_cost:.4f} "
                f"| ${check_cost:.6f} |"
            )
    append_results(lines)


def _run(
    provider: OfflineProvider, name: str, queries: int, root: Path, overrides: dict[str, object]
) -> tuple[RunConfig, list[QueryRecord]]:
    """The sample's first `queries` on Ray through `name`'s route, against `provider`."""
    route, suffix, extra = ROUTES[name]
    config = load_config(
        None,
        {
            "slice.sample": queries,
            "model": {
                "name": name,
                "litellm_model": route,
                "api_base": f"http://127.0.0.1:{provider.port}{suffix}",
                "reasoning_effort": "low",
                **extra,
            },
            "retrieval.index_root": str(root / "indexes"),
            **overrides,
        },
    )
    run_dir = root / name
    run_on_ray([(config, run_dir)], lambda _m: None)
    with RunStore(run_dir, config) as store:
        return config, store.records()


def cut_calls(queries: int, budget: float, latency: float) -> None:
    """Per route: the calls the budget cut and what they cost, as the run estimated them and as
    the emulator billed them, and the whole cost on either side."""
    aliases = {route.split("/", 1)[1]: "offline/heuristic" for route, _, _ in ROUTES.values()}
    pricing = load_pricing()
    lines = [
        *header(
            "Calls cut at the budget: the run's cost against the emulator's bill",
            f"{queries} sample queries (seeded), offline/heuristic behind each route, every "
            f"answer {latency} s late, a {budget} s budget per query.",
        ),
        "| route | calls cut (run) | calls cut (bill) | cut prompt tokens (run, estimated) "
        "| cut prompt tokens (bill) | cost (run) | of which estimated | cost (bill) "
        "| difference |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    config = OfflineConfig(
        model_aliases=aliases, latency=LatencyConfig(kind="fixed", seconds=latency)
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, (route, _, _) in ROUTES.items():
            with OfflineProvider(config) as provider:
                _, records = _run(
                    provider, name, queries, Path(tmp), {"agent.budget_seconds": budget}
                )
                while provider.in_flight:  # a cut request is billed when its client has left
                    time.sleep(0.05)
            price = pricing.price(name)
            assert price is not None
            ours = sum((r.usage for r in records), Usage())
            billed = provider.bill[("standard", _wire_model(name))]
            cost_run = price.cost(ours)
            cost_bill = price.cost(_billed(provider, name)) - _check_cost(provider, price)
            lines.append(
                f"| `{route}` | {sum(r.calls_usage_estimated for r in records)} "
                f"| {billed.cut_requests} | {ours.estimated_input_tokens:,} "
                f"| {billed.cut_prompt_tokens:,} | ${cost_run:.4f} "
                f"| ${price.estimated_cost(ours):.4f} | ${cost_bill:.4f} "
                f"| {100 * (cost_run - cost_bill) / cost_bill:+.2f} % |"
            )
    lines.append(
        "\nThe bill's column leaves out the one-word model check before each run (no query "
        "holds it). A cut call's prompt is the provider's count of the query's previous request "
        "plus the added part counted with the model's tokenizer (characters / 4 scaled by the "
        "provider's ratio where litellm has none): only the added part is estimated."
    )
    append_results(lines)


def _billed(provider: OfflineProvider, name: str) -> Usage:
    """The emulator's bill for `name`'s model at the standard tier, as our usage record."""
    return bill_usage(provider.bill[("standard", _wire_model(name))])


def _wire_model(name: str) -> str:
    """The model name the route sends (and the emulator bills under)."""
    return ROUTES[name][0].split("/", 1)[1]


def _check_cost(provider: OfflineProvider, price: Price) -> float:
    """What the one-word model check cost on the emulator's bill."""
    return sum(
        price.cost(bill_usage(r.usage))
        for r in provider.requests
        if r.usage is not None and _is_check(r.messages)
    )


if __name__ == "__main__":
    main()
