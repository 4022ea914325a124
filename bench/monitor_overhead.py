"""What watching a run costs it: the main job (`piserini-ray run` on the embedded sample, 100
questions, offline model and judge, `--engine ray`, the index built) with everything of the
monitor off, and with everything on: the status file rewritten every 0.5 s (four times as often
as the default), a reader polling the web view's `/api/runs` and a run's viewer index every
second, Ray metrics served on a metrics export port (a local Ray's full dashboard agent) and
scraped every second, and every query's trace sent over OTLP/HTTP. Off and on alternate, each
in a fresh process and run directory.

    python bench/monitor_overhead.py [--repeats 3] [--collector sink|phoenix|refusing]

The collector: `sink` (default) takes every batch and answers 200 from a process of its own,
so the run pays for making, encoding and sending every span and nothing else; `phoenix` (`make
phoenix`) stores them, on the same two cores as the run (at the lowest priority; the CPU it
used is printed: what a collector on the run's machine takes from it); `refusing`, a port that
refuses, the exporter's failing path.

Goal (issue 48): the makespan with everything on within 5 % of everything off.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _common import append_results, header

GOAL = 1.05
ROOT = Path(__file__).parents[1]
PHOENIX = ROOT / ".venv-phoenix/bin/phoenix"
#: An OTLP/HTTP receiver that takes every batch and keeps nothing (`--collector sink`).
SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

taken = 0

class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        global taken
        taken += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with open(sys.argv[2], "w") as f:
            f.write(str(taken))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _poll(urls: list[str], stop: threading.Event, seen: list[int]) -> None:
    """A reader that looks every second, as the web view and Prometheus do."""
    while not stop.wait(1.0):
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    body = answer.read()
                    seen.append(body.count(b"ray_piserini_queries_total"))
            except OSError:
                pass


PARTS = ("status", "watch", "metrics", "traces")


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system, its children included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def run_once(
    home: Path, on: bool, traces: str | None, parts: tuple[str, ...] = PARTS
) -> tuple[float, int]:
    run_dir = home / f"run-{'on' if on else 'off'}-{time.time_ns()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PISERINI_RAY_HOME"] = str(home)
    args = [sys.executable, "-m", "piserini_ray.cli", "run", "--run-dir", str(run_dir)]
    stop, seen = threading.Event(), []
    poller = None
    if on:
        metrics = _free_port()
        config = home / "on.yaml"
        settings = {
            "status": "status_seconds: 0.5",
            "metrics": f"metrics_export_port: {metrics}",
            "traces": f"traces_endpoint: '{traces}'",
        }
        chosen = [settings[p] for p in parts if p in settings]
        config.write_text(f"runtime: {{{', '.join(chosen)}}}\n")
        args += ["--config", str(config)]
        from piserini_ray.monitor.web import start_watch

        watch = start_watch(home, port=0)  # the warm-up's run is there: the new one joins
        base = watch.url.split("?")[0]
        urls = [f"{base}api/runs"] if "watch" in parts else []
        urls += [f"http://127.0.0.1:{metrics}/metrics"] if "metrics" in parts else []
        poller = threading.Thread(target=_poll, args=(urls, stop, seen), daemon=True)
    started = time.monotonic()
    if poller is not None:
        poller.start()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    makespan = time.monotonic() - started
    stop.set()
    if poller is not None:
        poller.join()
        watch.close()
    if done.returncode != 0:
        raise SystemExit(f"the run failed: {done.stderr[-2000:]}")
    return makespan, max(seen, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"what is on (default: all of {','.join(PARTS)})"
    )
    parser.add_argument(
        "--collector",
        choices=("sink", "phoenix", "refusing"),
        default="sink",
        help="where the traces go (default: a receiver that takes them and keeps nothing)",
    )
    args = parser.parse_args()
    parts = tuple(args.parts.split(","))
    phoenix = sink = None
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        home = Path(tmp)
        port = _free_port()
        traces = f"http://127.0.0.1:{port}"
        if args.collector == "phoenix":
            if not PHOENIX.exists():
                raise SystemExit(f"{PHOENIX} is missing: run `make phoenix` first")
            env = os.environ | {
                "PHOENIX_WORKING_DIR": str(home / "phoenix"), "PHOENIX_HOST": "127.0.0.1",
                "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(_free_port()),
            }  # fmt: skip
            phoenix = subprocess.Popen(
                ["nice", "-n", "19", str(PHOENIX), "serve"], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            collector = "Phoenix (nice 19)"
            for _ in range(120):
                try:
                    urllib.request.urlopen(f"{traces}/healthz", timeout=2)
                    break
                except OSError:
                    time.sleep(1)
        elif args.collector == "sink":
            taken = home / "sink-bytes"
            sink = subprocess.Popen([sys.executable, "-c", SINK, str(port), str(taken)])
            collector = "a receiver that takes every batch and keeps nothing"
        else:
            collector = "a refusing port"
        try:
            run_once(home, False, traces)  # warm: the index, the class archive, page cache
            off, on, series, collector_cpu = [], [], 0, []
            for _ in range(args.repeats):
                off.append(run_once(home, False, traces)[0])
                before = cpu_seconds(phoenix.pid) if phoenix is not None else 0.0
                seconds, seen = run_once(home, True, traces, parts)
                if phoenix is not None:
                    collector_cpu.append(cpu_seconds(phoenix.pid) - before)
                on.append(seconds)
                series = max(series, seen)
        finally:
            sunk_bytes = int(taken.read_text()) if sink is not None and taken.exists() else 0
            for process in (phoenix, sink):
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(60)
    ratio = statistics.median(on) / statistics.median(off)
    sunk = f" The receiver took {sunk_bytes / 2**20:.1f} MiB of spans in all." if sink else ""
    lines = header(
        "Monitoring overhead: the sample's makespan, everything off and on",
        f"On: {', '.join(parts)}; traces to {collector}; {args.repeats} alternating rounds "
        "after a warm-up run.",
    )
    lines += [
        "| monitor | makespans (s) | median (s) |",
        "|---|---|---:|",
        f"| off | {', '.join(f'{s:.1f}' for s in off)} | {statistics.median(off):.1f} |",
        f"| on | {', '.join(f'{s:.1f}' for s in on)} | {statistics.median(on):.1f} |",
        "",
        f"On / off: {ratio:.3f} (goal at most {GOAL}: {'met' if ratio <= GOAL else 'missed'}); "
        f"our metric series seen on the metrics port while on: "
        f"{'yes' if series else 'no'}."
        + (
            " The collector (Phoenix, on the same 2 cores) used "
            f"{statistics.median(collector_cpu):.1f} s of CPU per run (median) taking the spans in."
            if collector_cpu
            else ""
        )
        + sunk,
    ]
    append_results(lines)


if __name__ == "__main__":
    main()
