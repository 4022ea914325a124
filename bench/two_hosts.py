"""One host against two, on the two-host kit of the tests (`tests/hosts.py`: network namespaces
joined by a veth pair, host 2 a bare node with its own /tmp, HOME and PISERINI_RAY_HOME):
`piserini-ray run` from host 1 at 40 and 80 queries (the sample's questions, cycled), a model
whose every call takes 0.5 s (the offline provider's fixed latency, behind a hosted model's
name so that each node checks it through its relay), 2 queries at once per replica, one
replica per host, no quotas. Each measurement gets a fresh kit (Ray up and idle before the
clock starts: its idle workers have loaded the model client, `piserini_ray/warm.py`; host 2 has
never seen the index), so host 2 pays everything else a joining node pays.

    python bench/two_hosts.py [--queries 40,80] [--repeats 1] [--keep DIR]

Printed and appended to RESULTS.md: the makespans (the command, start to exit), the ratio, and
where a joining node's seconds go, from the run's own log lines (the replicas' lines carry the
time they were said at; the driver's are timed as they arrive): worker start (the driver's
"starting ... searcher replica(s)" to the replica's "worker started"), index (ready on that
node), JVM (up, index open), model check (through the replica's relay), and the first query.
Goals (issue 32): two / one at least 1.8x at 40 queries and 1.9x at 80. Needs root. `--keep DIR`
copies each run's directory (records, report) and its timed output (`output.txt`) into DIR.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
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


#: Ray's log deduplication would fold host 2's start-up lines into host 1's (alike but for
#: their numbers) and print them once.
ENV = {"OPENAI_API_KEY": "sk-bench-two-hosts", "RAY_DEDUP_LOGS": "0"}


#: What Ray's idle workers start while the cluster sits idle, besides their own imports: the
#: node's JVM class archive, if it is missing (`piserini_ray/warm.py`).
IDLE_WORK = (b"ray::IDLE", b"piserini_ray.retrieval._archive_main")


def _idle_work(kit: TwoHosts) -> tuple[dict[int, int], int]:
    """CPU ticks so far of each of Ray's idle worker processes (`ray::IDLE`) in the kit's
    namespaces (another Ray on the machine is none of its business) and of what they started
    (`IDLE_WORK`), and how many idle workers there are."""
    ticks, workers = {}, 0
    for pid, _ in kit.processes():
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
            if line.startswith(IDLE_WORK[0]) or IDLE_WORK[1] in line:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks[pid] = int(fields[11]) + int(fields[12])
                workers += line.startswith(IDLE_WORK[0])
        except OSError:
            continue
    return ticks, workers


def wait_until_idle(kit: TwoHosts, hosts: int, deadline_s: float = 120) -> None:
    """Wait until each host has its idle worker and none of them, nor what they started,
    works any more: the kit's `ray start` pre-starts one per host, which loads the model
    client (`piserini_ray/warm.py`, seconds of CPU) before it is idle. "Ray up and idle" then
    holds when the clock starts."""
    end = time.monotonic() + deadline_s
    before, _ = _idle_work(kit)
    while time.monotonic() < end:
        time.sleep(1.0)
        now, workers = _idle_work(kit)
        # > 5 % of a core, or started since the last look
        busy = [pid for pid, t in now.items() if t - before.get(pid, 0) > 5 or pid not in before]
        if workers >= hosts and not busy:
            return
        before = now
    print("the idle workers did not settle: measuring anyway", file=sys.stderr)


def measure(hosts: int, queries: int, index_root: Path, keep: Path | None = None) -> Measured:
    # A checkout on PYTHONPATH (a clone of the commit to measure) is what host 2 imports too.
    extra = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    kit = OneHost(host2_env=extra) if hosts == 1 else TwoHosts(host2_env=extra)
    with kit:
        kit.wait_for_nodes(hosts)
        config = _config(kit, queries, hosts, index_root)
        built = kit.run(_cli("index", "--config", str(config)), env=ENV)
        if built.returncode != 0:
            raise SystemExit(f"index failed:\n{built.stderr[-3000:]}")
        wait_until_idle(kit, hosts)
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
        if keep is not None:  # the run's records and its output, to look into by hand
            kept = keep / f"{hosts}h-{queries}q-{datetime.now(UTC):%H%M%S}"
            shutil.copytree(run_dir, kept)
            output = "".join(f"{t:.3f} {line}\n" for t, line in measured.lines)
            (kept / "output.txt").write_text(output)
        return measured


def _measured(hosts: int, queries: int, index_root: Path, keep: Path | None) -> Measured:
    """`measure`, tried once more (and said so) if the run failed."""
    try:
        return measure(hosts, queries, index_root, keep)
    except SystemExit as failed:
        print(f"{failed}\n(trying once more)", file=sys.stderr)
        return measure(hosts, queries, index_root, keep)


def _at(m: Measured, clock: str) -> float:
    """A replica line's HH:MM:SS.mmm (UTC) as seconds since the command started."""
    day = datetime.fromtimestamp(m.started, UTC)
    hour, minute, second = clock.split(":")
    when = day.replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)
    return when.timestamp() + float(second) - m.started


def _first(m: Measured, *markers: str) -> float | None:
    return next((t for t, line in m.lines if all(x in line for x in markers)), None)


#: A replica's start-up steps: the marker of each one's line.
STEPS = {
    "worker started": "worker started",
    "index ready": "index ready in",
    "JVM up": "JVM up",
    "searcher open": "searcher open",
    "model checked": "model check of",
    "first query started": "first query started",
    "first query done": "first query done",
}
SECONDS = re.compile(r" in (\d+\.\d+) s")


def replica_steps(m: Measured, ip: str) -> dict[str, tuple[float, float | None]]:
    """Each step of the replica on `ip`: when it was said (seconds since the command started)
    and the duration it names (`... in X s`), if any."""
    said: dict[str, tuple[float, float | None]] = {}
    for _, line in m.lines:
        found = REPLICA.search(line)
        if not found or found.group(2) != ip:
            continue
        for step, marker in STEPS.items():
            if found.group(4).startswith(marker) and step not in said:
                took = SECONDS.search(found.group(4))
                said[step] = (_at(m, found.group(1)), float(took.group(1)) if took else None)
    return said


def _ips(m: Measured) -> list[str]:
    return sorted({found.group(2) for _, line in m.lines if (found := REPLICA.search(line))})


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def node_rows(results: dict[tuple[int, int], list[Measured]]) -> list[str]:
    """Every replica's start-up (the first repeat of each run): when each step was done,
    seconds since the command started, and the driver's own steps."""
    lines = [
        "| run | node | replicas asked | " + " | ".join(STEPS) + " | all ready (driver) |",
        "|---|---|" + "---:|" * (len(STEPS) + 2),
    ]
    for (hosts, queries), runs in sorted(results.items()):
        m = runs[0]
        for ip in _ips(m):
            steps = replica_steps(m, ip)
            cells = [_cell(steps[k][0] if k in steps else None) for k in STEPS]
            lines.append(
                f"| {hosts} host(s), {queries} q | {ip} | "
                f"{_cell(_first(m, 'searcher replica(s) for'))} | " + " | ".join(cells) + " | "
                f"{_cell(_first(m, 'searcher replica(s) ready'))} |"
            )
    return lines


def joining_rows(results: dict[tuple[int, int], list[Measured]]) -> list[str]:
    """Where a joining node's seconds go (host 2 of each two-host run, first repeat)."""
    lines = [
        "| run | worker start | JVM boot | index (shipped, checked) | worker started -> "
        "searcher open | open -> model checked | checked -> first query | first query |",
        "|---|" + "---:|" * 7,
    ]
    for (hosts, queries), runs in sorted(results.items()):
        m = runs[0]
        for ip in [ip for ip in _ips(m) if hosts == 2 and not ip.endswith(".1")]:
            s = replica_steps(m, ip)
            at = {k: v[0] for k, v in s.items()}
            asked = _first(m, "searcher replica(s) for")

            def span(a: float | None, b: float | None) -> str:
                return "-" if a is None or b is None else f"{b - a:.1f}"

            checked = at.get("model checked")
            cells = [
                span(asked, at.get("worker started")),
                _cell(s.get("JVM up", (0, None))[1]),
                _cell(s.get("index ready", (0, None))[1]),
                span(at.get("worker started"), at.get("searcher open")),
                span(at.get("searcher open"), checked),
                span(checked, at.get("first query started")),
                _cell(s.get("first query done", (0, None))[1]),
            ]
            lines.append(f"| {queries} q | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default="40,80")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--label", default="", help="what is measured (a commit), in the title")
    parser.add_argument(
        "--keep", type=Path, help="copy each run's directory and output here, to look into"
    )
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
                        _measured(hosts, queries, index_root, args.keep)
                    )
    lines = header(
        "Two hosts against one (issue 32)" + (f": {args.label}" if args.label else ""),
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
            "-" if goal is None else f">= {goal}x: " + ("met" if one / two >= goal else "MISSED")
        )
        lines.append(f"| {queries} | {one:.1f} | {two:.1f} | {one / two:.2f}x | {verdict} |")
    lines += [
        "",
        "Each replica's start-up, seconds since the command started (`-`: no such line):",
        "",
    ]
    lines += node_rows(results)
    lines += ["", "Where a joining node's seconds go (host 2; durations the replica names):", ""]
    lines += joining_rows(results)
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
