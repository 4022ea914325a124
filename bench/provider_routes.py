"""Each provider's native route end to end on Ray, against the offline provider's emulators:
the sample through litellm's `anthropic/`, `deepseek/` and `openai/` routes (thinking or
reasoning on; OpenAI's Chat Completions for gpt-5, its Responses API for gpt-5.4-mini), and
per route the cached-token ratio and cost as the run recorded them against the emulator's own
bill (its usage log priced with the same table).

    python bench/provider_routes.py [--queries 20]

The one-word model check before each run is on the bill too (it is real spending); it is shown
apart, since no query's record holds it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import orjson
from _common import append_results, header

from piserini_ray.config import load_config
from piserini_ray.llm.check import PROMPT
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.pipeline import run_on_ray
from piserini_ray.records import Usage
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
    args = parser.parse_args()
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
    with tempfile.TemporaryDirectory() as tmp:
        config_base = OfflineConfig(model_aliases=aliases, request_log=100_000)
        for name, (route, suffix, extra) in ROUTES.items():
            with OfflineProvider(config_base) as provider:
                config = load_config(
                    None,
                    {
                        "slice.sample": args.queries,
                        "model": {
                            "name": name,
                            "litellm_model": route,
                            "api_base": f"http://127.0.0.1:{provider.port}{suffix}",
                            "reasoning_effort": "low",
                            **extra,
                        },
                        "retrieval.index_root": str(Path(tmp) / "indexes"),
                    },
                )
                run_dir = Path(tmp) / name
                run_on_ray([(config, run_dir)], lambda _m: None)
                bills = [r for r in provider.requests if r.usage is not None]
            with RunStore(run_dir, config) as store:
                records = store.records()
            price = pricing.price(name)
            assert price is not None
            check = [r for r in bills if _is_check(r.messages)]
            billed = [r.usage for r in bills if not _is_check(r.messages)]
            ours = sum((r.usage for r in records), Usage())
            bill = Usage(
                input_tokens=sum(u.prompt_tokens for u in billed),
                cached_tokens=sum(u.cached_tokens for u in billed),
                cache_write_tokens=sum(u.cache_write_tokens for u in billed),
                output_tokens=sum(u.completion_tokens for u in billed),
            )
            check_cost = sum(
                price.cost(
                    Usage(
                        input_tokens=r.usage.prompt_tokens,
                        cached_tokens=r.usage.cached_tokens,
                        cache_write_tokens=r.usage.cache_write_tokens,
                        output_tokens=r.usage.completion_tokens,
                    )
                )
                for r in check
                if r.usage is not None
            )
            ratio, billed_ratio = (u.cached_tokens / max(1, u.input_tokens) for u in (ours, bill))
            lines.append(
                f"| `{route}` | {len(records)} | {100 * ratio:.1f} % | "
                f"{100 * billed_ratio:.1f} % | ${price.cost(ours):.4f} | ${price.cost(bill):.4f} "
                f"| ${check_cost:.6f} |"
            )
    append_results(lines)


if __name__ == "__main__":
    main()
