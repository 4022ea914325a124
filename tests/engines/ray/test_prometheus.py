"""Our Ray metrics as a lab scrapes them: a real Prometheus (Debian's `prometheus`, which
`.ci/run` installs) scraping the metrics export port of a Ray head started with `ray start`, a
run joining it with a priced model (the offline agent under a hosted model's name, behind a
provider on loopback); once the run has ended, the scraped totals are the run's records:
queries by status, tokens by kind, cost."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig, OfflineProvider
from piserini_ray.records import Usage

PROMETHEUS = shutil.which("prometheus")
VENV_BIN = Path(sys.executable).parent
MODEL = "gpt-5.4-mini"
QUERIES = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run installs it)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _process(command: list[str], log: Path, **kwargs: object) -> Iterator[subprocess.Popen]:
    """A process of the test's, ended by its PID (SIGTERM, then SIGKILL)."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **kwargs
        )  # type: ignore[call-overload]
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def _query(base: str, expression: str) -> float | None:
    """The value of a PromQL expression now (None: no series yet)."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url) as answer:
        result = json.loads(answer.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[OfflineProvider]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-prometheus")
    served = OfflineConfig(model_aliases={MODEL: "offline/heuristic"})
    with OfflineProvider(served) as running:
        yield running


def test_prometheus_scrapes_the_runs_records(
    sample_index: Path, tmp_path: Path, provider: OfflineProvider
) -> None:
    gcs, metrics, web = _free_port(), _free_port(), _free_port()
    temp = Path(tempfile.mkdtemp(prefix="pr-ray-", dir="/tmp"))  # Unix sockets: a short path
    ray_start = [
        str(VENV_BIN / "ray"), "start", "--block", "--head", "--node-ip-address=127.0.0.1",
        f"--port={gcs}", f"--metrics-export-port={metrics}", "--num-cpus=2",
        f"--object-store-memory={100 << 20}", "--include-dashboard=false",
        f"--temp-dir={temp}", "--disable-usage-stats",
        '--system-config={"metrics_report_interval_ms": 500}',
    ]  # fmt: skip
    scrape = tmp_path / "prometheus.yml"
    scrape.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs: [{job_name: ray, static_configs: "
        f"[{{targets: ['127.0.0.1:{metrics}']}}]}}]\n"
    )
    prometheus = [
        str(PROMETHEUS), f"--config.file={scrape}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web}",
    ]  # fmt: skip
    config = tmp_path / "run.yaml"
    config.write_text(
        f"retrieval: {{index_root: '{sample_index.parent}'}}\n"
        f"slice: {{sample: {QUERIES}, seed: 2}}\n"
        f"model: {{name: {MODEL}, litellm_model: openai/{MODEL}, "
        f"api_base: '{provider.base_url}'}}\n"
        f"runtime: {{address: '127.0.0.1:{gcs}', max_concurrency: 2}}\n"
    )
    run_dir = tmp_path / "run"
    base = f"http://127.0.0.1:{web}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    try:
        with (
            _process(ray_start, tmp_path / "ray.log", env=env, start_new_session=True),
            _process(prometheus, tmp_path / "prometheus.log"),
        ):
            wait_for("Prometheus", lambda: _ready(base))
            done = subprocess.run(
                [sys.executable, "-m", "piserini_ray.cli", "run", "--config", str(config),
                 "--run-dir", str(run_dir)],
                capture_output=True, text=True, env=env, timeout=600,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-3000:]
            records = [
                orjson.loads(li) for li in (run_dir / "records.jsonl").read_bytes().splitlines()
            ]
            statuses = Counter(r["status"] for r in records)
            usage = sum((Usage.model_validate(r["usage"]) for r in records), Usage())
            price = load_pricing().price(MODEL)
            assert price is not None
            cost = sum(price.cost(Usage.model_validate(r["usage"])) for r in records)
            tag = f'run="{run_dir.name}",model="{MODEL}"'

            def scraped(expression: str, value: float) -> bool:
                got = _query(base, expression)
                return got is not None and abs(got - value) <= 1e-6 * max(1.0, value)

            wait_for(
                "the scraped query count",
                lambda: scraped(f"sum(ray_piserini_queries_total{{{tag}}})", len(records)),
                deadline_s=120,
            )
            for status, n in statuses.items():
                expr = f'sum(ray_piserini_queries_total{{{tag},status="{status}"}})'
                assert scraped(expr, n), expr
            for kind in ("input", "output", "cached"):
                expr = f'sum(ray_piserini_tokens_total{{{tag},kind="{kind}"}})'
                assert scraped(expr, getattr(usage, f"{kind}_tokens")), expr
            assert cost > 0 and scraped(f"sum(ray_piserini_cost_usd_total{{{tag}}})", cost)
            turns = sum(len(r["trajectory"]) for r in records)
            expr = f"sum(ray_piserini_model_call_seconds_count{{{tag}}})"
            assert scraped(expr, turns), expr
            assert scraped(f"sum(ray_piserini_queries_running{{{tag}}})", 0)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready") as answer:
            return answer.status == 200
    except OSError:
        return False
