"""The main job on both engines: `piserini-ray run` over the embedded sample (100 questions,
offline model and judge), from a cold start to the printed report, with `--engine ray` and
`--engine local`, each in a fresh run directory and process; and `--engine ray` joining a Ray
that is already up (`RAY_ADDRESS`, as on a cluster or after `ray start --head`: no Ray start-up
or shutdown in the makespan; the bench starts it with `ray.cluster_utils.Cluster` and ends it).

    python bench/engines.py [--repeats 1]

Goal: the Ray engine's makespan at most 1.3x the local engine's on the same config (issue 32;
1.5x before). The phases come from the command's own log lines (time of the first line that
names each).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import append_results, header

#: The Ray engine's makespan over the local engine's, at most (issue 32).
GOAL = 1.3
#: Log lines that open each phase, in order (any of the markers). The queries are done when
#: the judging after them starts, or, on Ray (which judges each answer as it comes), when the
#: judging beside them has ended.
PHASES = {
    "ray up": ("started a local Ray instance",),
    "replicas ready": ("searcher replica(s) ready",),
    "queries done": ("judging ", "answers judged while the queries ran"),
}


def run_once(engine: str, home: Path, address: str | None = None) -> tuple[float, dict[str, float]]:
    env = os.environ | {"PISERINI_RAY_HOME": str(home)}
    if address:
        env["RAY_ADDRESS"] = address
    started = time.monotonic()
    seen: dict[str, float] = {}
    with subprocess.Popen(
        [sys.executable, "-m", "piserini_ray.cli", "run", "--engine", engine,
         "--run-dir", str(home / f"run-{engine}-{time.time_ns()}")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    ) as process:  # fmt: skip
        assert process.stderr is not None
        for line in process.stderr:
            for phase, markers in PHASES.items():
                if any(m in line for m in markers) and phase not in seen:
                    seen[phase] = time.monotonic() - started
        if process.wait() != 0:
            raise SystemExit(f"the {engine} run failed")
    return time.monotonic() - started, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="engines-bench-") as tmp:
        home = Path(tmp)
        # The index is built once, before timing: both engines then find it.
        subprocess.run(
            [sys.executable, "-m", "piserini_ray.cli", "index"],
            env=os.environ | {"PISERINI_RAY_HOME": str(home)},
            check=True,
            capture_output=True,
        )
        results = {
            engine: [run_once(engine, home) for _ in range(args.repeats)]
            for engine in ("local", "ray")
        }
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 2,
                "include_dashboard": False,
                "object_store_memory": 2**28,
            },
        )
        try:
            results["ray, Ray already up"] = [
                run_once("ray", home, cluster.address) for _ in range(args.repeats)
            ]
        finally:
            cluster.shutdown()
    lines = header("Engines: the main job end to end", "The sample, 100 questions, offline.")
    lines += [
        "| engine | makespan (s) | Ray started (s) | replicas ready (s) | queries done (s) |",
        "|---|---|---|---|---|",
    ]
    for engine, runs in results.items():
        for total, seen in runs:
            cells = [f"{seen[p]:.1f}" if p in seen else "-" for p in PHASES]
            lines.append(f"| {engine} | {total:.1f} | " + " | ".join(cells) + " |")
    local = min(t for t, _ in results["local"])
    lines.append("")
    for engine in ("ray", "ray, Ray already up"):
        ray = min(t for t, _ in results[engine])
        verdict = "met" if ray <= GOAL * local else "MISSED"
        lines.append(f"{engine} / local makespan: {ray / local:.2f}x (goal <= {GOAL}x): {verdict}.")
    append_results(lines)


if __name__ == "__main__":
    main()
