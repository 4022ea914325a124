"""Watching runs from any terminal or browser while they go: `status`, `watch`, `stop`
(the API's `run_status`, `watch`, `request_stop`, `wait_until_stopped`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piserini_ray.monitor.status import StatusView


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def status_row(name: str, seen: StatusView | None) -> list[str]:
    """One run's row of the `status` table."""
    if seen is None:
        return [name, "no status yet", *[""] * 9]
    s = seen.status
    state = seen.state
    if seen.stale:
        state += f" (last written {_duration(seen.age_seconds)} ago)"
    accuracy = ""
    if s.accuracy_judged is not None and s.accuracy_ci95 is not None:
        low, high = s.accuracy_ci95
        accuracy = f"{100 * s.accuracy_judged:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
    cost = "unpriced" if s.cost_usd is None else f"${s.cost_usd:,.4f}"
    if s.cost_estimated_usd:
        cost += f" (${s.cost_estimated_usd:,.4f} est.)"
    retries = ", ".join(f"{k} {v}" for k, v in sorted(s.retries.items())) or "0"
    return [
        name,
        state,
        f"{s.recorded_total}/{s.queries}",
        ", ".join(f"{k} {v}" for k, v in sorted(s.recorded.items())) or "-",
        str(s.running),
        retries,
        f"{s.judged} ({accuracy})" if accuracy else str(s.judged),
        cost,
        "" if s.queries_per_minute is None else f"{s.queries_per_minute:.1f}",
        _duration(s.eta_seconds) if seen.state == "running" else "",
        ", ".join(f"{node} x{n}" for node, n in sorted(s.replicas.items())),
    ]


HEADER = [
    "run",
    "state",
    "recorded",
    "by status",
    "running",
    "retries",
    "judged (accuracy %)",
    "cost",
    "q/min",
    "ETA",
    "replicas",
]


def cmd_status(args: argparse.Namespace) -> int:
    """A table of every run under PATH from their status files (or `--json`)."""
    from piserini_ray import api

    views = api.run_status(args.path)
    if args.json:
        import orjson

        print(
            orjson.dumps(
                [
                    {"run_dir": str(d), "state": v.state, **v.model_dump(mode="json")}
                    if v is not None
                    else {"run_dir": str(d), "state": None}
                    for d, v in views
                ],
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
        return 0
    root = args.path.absolute()
    rows = [status_row(str(d.relative_to(root)) if d != root else d.name, v) for d, v in views]
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    for row in [HEADER, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    stale = [d for d, v in views if v is not None and v.stale]
    if stale:
        print(
            f"\n{len(stale)} run(s) are stale: their driver stopped writing (it died or was "
            "killed); run the same command again to resume them"
        )
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """Serve the live web view until Ctrl-C."""
    from piserini_ray import api
    from piserini_ray.monitor.web import is_loopback

    watch = api.watch(args.path, args.host, args.port)
    print(f"watching {args.path.absolute()}: open {watch.url}", flush=True)
    if not is_loopback(args.host):
        print("(not on loopback: every request needs that token)", flush=True)
    try:
        watch.thread.join()
    except KeyboardInterrupt:
        print("\nwatch stopped")
    finally:
        watch.close()
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask one run's driver to stop it; with `--wait` (the default), until it has."""
    from piserini_ray import api

    path = api.request_stop(args.run_dir)
    print(f"stop requested ({path}); the run's driver stops it within a second", flush=True)
    if args.no_wait:
        return 0
    seen = api.wait_until_stopped(args.run_dir, args.timeout)
    if seen is None:
        print(f"the run did not stop within {args.timeout:g} s; its status still says running")
        return 1
    print(
        f"{args.run_dir}: {seen.state}, {seen.status.recorded_total}/{seen.status.queries} "
        "recorded; run the same command again to resume it"
    )
    return 0
