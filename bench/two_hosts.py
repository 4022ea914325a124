"""One host against two, on the two-host kit of the tests (`tests/hosts.py`: network namespaces
joined by a veth pair, host 2 a bare node with its own /tmp, HOME and PISERINI_RAY_HOME):
`piserini-ray run` from host 1 at 40 and 80 queries (the sample's questions, cycled), a model
whose every call takes 0.5 s (the offline provider's fixed latency, behind a hosted model's
name so that each node checks it through its gateway), 2 queries at once per replica, one
replica per host, no quotas. Each measurement gets a fresh kit (Ray up and idle before the
clock starts; host 2 has never seen the index), so host 2 pays everything a joining node pays.

    python bench/two_hosts.py [--queries 40,80] [--repeats 1]

Printed and appended to RESULTS.md: the makespans (the command, start to exit), the ratio, and
where a joining node's seconds go, from the run's own log lines (the replicas' lines carry the
time they were said at; the driver's are timed as they arrive): worker start (the driver's
"starting ... searcher replica(s)" to the replica's "worker started"), index (ready on that
node), JVM (up, index open), model check (through the node's gateway), and the first query.
Goals (issue 32): two / one at least 1.8x at 40 queries and 1.9x at 80. Needs root.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _common import append_results, cycled_sample, header
from hosts import VENV_BIN, TwoHosts, skip_reason

LATENCY = 0.5
GOALS = {40: 1.8, 80: 1.9}
#: A replica's start-up line: `[piserini-ray] HH:MM:SS.mmm replica on IP pid N: what`.
REPLICA = re.compile(r"\[piserini-ray\] (\d\d:\d\d:\d\d\.\d{3}) replica on (\S+) pid (\d+): (.*)")


class OneHost(TwoHosts):
    """The kit's host 1 alone: the same namespace, `ray start` and driver, no second node."""

    def _start_host2(self) -> None:
        pass


@dataclass
class Measured:
    hosts: int
    queries: int
    makespan: float
    #: (seconds since the command started, line) of everything it printed.
    lines: list[tuple[float, str]] = field(default_factory=list)
    started: float = 0.0  # wall clock (time.time()) at the command's start


def _config(kit: TwoHosts, queries: int, replicas: int, index_root: Path) -> Path:
    folder = kit.data / f"bench-{queries}"
    config = cycled_sample(folder, queries, "two-hosts", "th")
    config.write_text(
        config.read_text()
        + "model: {name: gpt-5.4-mini, litellm_model: openai/gpt-5.4-mini}\n"
        + "judge: {model: {name: offline/exact-match-judge}}\n"
        + "offline:\n"
        + f"  latency: {{kind: fixed, seconds: {LATENCY}}}\n"
        + "  model_aliases: {gpt-5.4-mini: offline/heuristic}\n"
        + f"retrieval: {{index_root: '{index_root}'}}\n"
        + f"runtime: {{address: '{kit.head_address}', replicas: {replicas}, "
        + "placement: spread, cpus_per_replica: 1, max_concurrency: 2}\n"
    )
    return config


def _cli(*args: str) -> list[str]:
    return [str(VENV_BIN / "python"), "-m", "piserini_ray.cli", *args]


ENV = {"OPENAI_API_KEY": "sk-bench-two-hosts"}


def measure(hosts: int, queries: int, index_root: Path) -> Measured:
    # A checkout on PYTHONPATH (a clone of the commit to measure) is what host 2 imports too.
    extra = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    kit = OneHost(host2_env=extra) if hosts == 1 else TwoHosts(host2_env=extra)
    with kit:
        kit.wait_for_nodes(hosts)
        config = _config(kit, queries, hosts, index_root)
        built = kit.run(_cli("index", "--config", str(config)), env=ENV)
        if built.returncode != 0:
            raise SystemExit(f"index failed:\n{built.stderr[-3000:]}")
        run_dir = kit.data / "run"
        measured = Measured(hosts, queries, 0.0, started=time.time())
        began = time.monotonic()
        process = kit.popen(
            _cli("run", "--config", str(config), "--run-dir", str(run_dir)), env=ENV
        )
        lock = threading.Lock()

        def read(stream: object) -> None:
            for line in stream:  # type: ignore[attr-defined]
                with lock:
                    measured.lines.append((time.monotonic() - began, line.rstrip("\n")))

        readers = [
            threading.Thread(target=read, args=(s,)) for s in (process.stdout, process.stderr)
        ]
        for reader in readers:
            reader.start()
        code = process.wait()
        measured.makespan = time.monotonic() - began
        for reader in readers:
            reader.join()
        if code != 0:
            tail = "\n".join(line for _, line in measured.lines[-60:])
            raise SystemExit(f"the run on {hosts} host(s) failed ({code}):\n{tail}")
        print(f"{hosts} host(s), {queries} queries: {measured.makespan:.1f} s", file=sys.stderr)
        return measured


def _at(m: Measured, clock: str) -> float:
    """A replica line's HH:MM:SS.mmm (UTC) as seconds since the command started."""
    day = datetime.fromtimestamp(m.started, UTC)
    hour, minute, second = clock.split(":")
    when = day.replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)
    return when.timestamp() + float(second) - m.started


def _first(m: Measured, *markers: str) -> float | None:
    return next((t for t, line in m.lines if all(x in line for x in markers)), None)


def phases(m: Measured, ip: str) -> dict[str, float | None]:
    """Seconds since the command started at which each start-up step of the replica on `ip`
    was done, and the driver's own steps."""
    said: dict[str, float] = {}
    for _, line in m.lines:
        found = REPLICA.search(line)
        if found and found.group(2) == ip:
            what = found.group(4)
            key = next(
                (
                    k
                    for k, marker in (
                        ("worker started", "worker started"),
                        ("index ready", "index ready"),
                        ("JVM up", "JVM up"),
                        ("searcher open", "searcher open"),
                        ("model checked", "model check of"),
                        ("first query started", "first query started"),
                        ("first query done", "first query done"),
                    )
                    if marker in what
                ),
                None,
            )
            if key and key not in said:
                said[key] = _at(m, found.group(1))
    return {
        "replicas asked": _first(m, "searcher replica(s) for"),
        **{
            k: said.get(k)
            for k in (
                "worker started",
                "index ready",
                "JVM up",
                "searcher open",
                "model checked",
                "first query started",
                "first query done",
            )
        },
        "all ready (driver)": _first(m, "searcher replica(s) ready"),
        "judging (driver)": _first(m, "judging "),
    }


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default="40,80")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if reason := skip_reason():
        raise SystemExit(f"two hosts cannot be made here: {reason}")
    counts = [int(q) for q in args.queries.split(",")]
    results: dict[tuple[int, int], list[Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="two-hosts-bench-") as tmp:
        index_root = Path(tmp) / "indexes"  # on host 1's disk, not on host 2's (/tmp)
        for _ in range(args.repeats):
            for queries in counts:
                for hosts in (1, 2):  # side by side, in turn
                    results.setdefault((hosts, queries), []).append(
                        measure(hosts, queries, index_root)
                    )
    lines = header(
        "Two hosts against one (issue 32)",
        f"The kit of tests/hosts.py (network namespaces, host 2 bare), a fresh kit per run; "
        f"`piserini-ray run` from host 1; the sample's questions cycled; gpt-5.4-mini served by "
        f"the offline provider (offline/heuristic) at a fixed {LATENCY} s per call; 2 queries at "
        "once per replica, one replica per host, no quotas; makespan = the command, start to "
        "exit (judging and the report included). Best of the repeats.",
    )
    lines += [
        "| queries | one host (s) | two hosts (s) | two / one | goal |",
        "|---|---:|---:|---:|---|",
    ]
    for queries in counts:
        one = min(m.makespan for m in results[(1, queries)])
        two = min(m.makespan for m in results[(2, queries)])
        goal = GOALS.get(queries)
        verdict = (
            "-"
            if goal is None
            else f">= {goal}x: {'met' if two and one / two >= goal else 'MISSED'}"
        )
        lines.append(f"| {queries} | {one:.1f} | {two:.1f} | {one / two:.2f}x | {verdict} |")
    lines += [
        "",
        "Start-up of each node, seconds since the command started (the first repeat; the "
        "replicas' own time stamps; `-`: no such line):",
        "",
    ]
    steps = list(phases(Measured(1, 0, 0.0), "").keys())
    lines += ["| run | node | " + " | ".join(steps) + " |", "|---|---|" + "---:|" * len(steps)]
    for (hosts, queries), runs in sorted(results.items()):
        m = runs[0]
        ips = sorted({found.group(2) for _, line in m.lines if (found := REPLICA.search(line))})
        for ip in ips:
            cells = [_cell(v) for v in phases(m, ip).values()]
            lines.append(f"| {hosts} host(s), {queries} q | {ip} | " + " | ".join(cells) + " |")
    lines += ["", "A joining node's seconds (host 2 of each two-host run), step by step:", ""]
    lines += [
        "| run | worker start | index | JVM + open | ready -> model checked | all ready (driver) "
        "| first query | ready to first query |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (hosts, queries), runs in sorted(results.items()):
        if hosts != 2:
            continue
        m = runs[0]
        ips = sorted({found.group(2) for _, line in m.lines if (found := REPLICA.search(line))})
        joining = [ip for ip in ips if not ip.endswith(".1")]
        for ip in joining:
            p = phases(m, ip)

            def span(a: str, b: str, p: dict[str, float | None] = p) -> str:
                x, y = p.get(a), p.get(b)
                return "-" if x is None or y is None else f"{y - x:.1f}"

            lines.append(
                f"| {queries} q | {span('replicas asked', 'worker started')} | "
                f"{span('worker started', 'index ready')} | "
                f"{span('index ready', 'searcher open')} | "
                f"{span('searcher open', 'model checked')} | {_cell(p['all ready (driver)'])} | "
                f"{span('first query started', 'first query done')} | "
                f"{span('searcher open', 'first query started')} |"
            )
    warned = [
        f"{hosts} host(s), {queries} q: {line}"
        for (hosts, queries), runs in results.items()
        for m in runs
        for _, line in m.lines
        if "blocking ray.get" in line
    ]
    lines += ["", f'Lines saying "blocking ray.get" in the runs\' output: {len(warned)}.']
    append_results(lines)
    print(*warned[:4], sep="\n", file=sys.stderr)


if __name__ == "__main__":
    main()
