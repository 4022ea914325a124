"""Watching a sweep while it runs, as a user would: a real `piserini-ray sweep` driver (its own
local Ray) over a provider the test holds (`EmulatedProvider.hold`: past a set number of calls,
every call waits unanswered, so the runs stay mid-way for as long as the test looks), then
`piserini-ray status`, the live web view in real headless Chromium, and `stop` of one run from
the page's button while the other goes on; the sweep run again resumes the stopped run and
nothing else. Every wait is on an event (a held call, a file that says so), never a clock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest
from chromium_devtools import Browser, needs_chromium
from helpers import file_tail, wait_for

from piserini_ray.cli.monitor import status_row
from piserini_ray.monitor.status import read_status
from piserini_ray.monitor.web import start_watch
from piserini_ray.offline import OfflineConfig
from piserini_ray_testkit import EmulatedProvider

pytestmark = [pytest.mark.slow, needs_chromium]

MODEL = "gpt-5.4-mini"
#: Calls answered before the provider holds the rest: the model checks and a few whole
#: queries, never a whole run (a query takes 7 to 12 calls).
ANSWERED = 30
QUERIES = 5


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "piserini_ray.cli", *args]


def _on_disk(run_dir: Path) -> Counter[str]:
    """The records on disk now, by status (whole lines only)."""
    path = run_dir / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True) if path.exists() else []
    return Counter(orjson.loads(line)["status"] for line in lines if line.endswith(b"\n"))


def _bytes(run_dir: Path) -> bytes:
    path = run_dir / "records.jsonl"
    return path.read_bytes() if path.exists() else b""


def _records(run_dir: Path, name: str = "records.jsonl") -> list[dict]:
    path = run_dir / name
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _state(run_dir: Path) -> str | None:
    seen = read_status(run_dir)
    return None if seen is None else seen.state


def _running(runs: list[Path]) -> int:
    """Queries in flight, as the runs' status files say (none counted both recorded and in
    flight)."""
    seen = [s.status for d in runs if (s := read_status(d)) is not None]
    for status in seen:
        assert status.recorded_total + status.running <= QUERIES, status
    return sum(status.running for status in seen)


def _statuses(runs: list[Path]) -> str:
    """Each run's row of the `status` table (state, records, in flight), for a failure."""
    return "".join(" | ".join(status_row(d.name, read_status(d))) + "\n" for d in runs)


def _status_matches_disk(run_dir: Path) -> bool:
    seen = read_status(run_dir)
    return seen is not None and Counter(seen.status.recorded) == _on_disk(run_dir)


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-watch")
    served = OfflineConfig(prefix_caching=False, model_aliases={MODEL: "offline/heuristic"})
    with EmulatedProvider(served) as running:
        yield running


def _sweep_file(tmp_path: Path, sample_index: Path, provider: EmulatedProvider) -> Path:
    (tmp_path / "base.yaml").write_text(
        f"retrieval: {{index_root: '{sample_index.parent}'}}\n"
        f"slice: {{sample: {QUERIES}, seed: 3}}\n"
        f"model: {{name: {MODEL}, litellm_model: openai/{MODEL}, "
        f"api_base: '{provider.base_url}'}}\n"
        "runtime: {max_concurrency: 2, status_seconds: 0.5}\n"
    )
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: watched\nbase: base.yaml\ngrid:\n  agent.budget_seconds: [200, 300]\n")
    return sweep


def _rows(browser: Browser) -> dict[str, dict[str, str]]:
    """The page's table: each run's cells by field, as the browser shows them."""
    return dict(
        browser.evaluate(
            """Object.fromEntries([...document.querySelectorAll("#runs tbody tr")].map(tr =>
                 [tr.dataset.name, Object.fromEntries([...tr.querySelectorAll("td")].map(
                   td => [td.dataset.field, td.textContent]))]))"""
        )
    )


def _polls(browser: Browser) -> int:
    # Before the page has loaded there is no body yet: no look either.
    return int(browser.evaluate("(document.body && document.body.dataset.polls) || '0'"))


def test_a_sweep_watched_live_and_one_run_stopped(
    sample_index: Path, tmp_path: Path, provider: EmulatedProvider
) -> None:
    sweep = _sweep_file(tmp_path, sample_index, provider)
    root = tmp_path / "runs"
    env = {**os.environ, "PISERINI_RAY_HOME": str(tmp_path / "home")}
    provider.hold(after=ANSWERED)
    # The driver's messages go to a file, so that a failure mid-run can show them.
    driver_log = tmp_path / "driver.log"
    with driver_log.open("wb") as log:
        driver = subprocess.Popen(
            _cli("sweep", str(sweep), "--runs-root", str(root)),
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
            start_new_session=True,
        )
    watch = None
    browser = None
    try:
        # Both of the replica's slots wait on the provider: nothing more can be recorded.
        assert provider.wait_held(2), "the sweep never had its queries in flight"
        runs = sorted(p.parent for p in (root / "watched").glob("*/manifest.json"))
        assert len(runs) == 2
        for run_dir in runs:
            wait_for(f"{run_dir.name}'s status", lambda d=run_dir: _status_matches_disk(d))
        wait_for("the two queries in flight in the statuses", lambda: _running(runs) == 2)

        # `piserini-ray status`, from another process, while the sweep runs.
        shown = subprocess.run(
            _cli("status", str(root), "--json"), capture_output=True, text=True, env=env
        )
        assert shown.returncode == 0, shown.stderr
        statuses = {Path(s["run_dir"]).name: s for s in orjson.loads(shown.stdout)}
        for run_dir in runs:
            status = statuses[run_dir.name]
            assert status["state"] == "running"
            assert Counter(status["status"]["recorded"]) == _on_disk(run_dir)
        table = subprocess.run(_cli("status", str(root)), capture_output=True, text=True)
        for run_dir in runs:
            line = next(li for li in table.stdout.splitlines() if run_dir.name in li)
            assert f" {sum(_on_disk(run_dir).values())}/{QUERIES} " in line, table.stdout

        # The web view in headless Chromium: its counts are the records on disk.
        watch = start_watch(root, port=0)
        browser = Browser(watch.url, tmp_path / "chromium")
        wait_for("the page's first look", lambda: _polls(browser) >= 1)
        rows = _rows(browser)
        assert set(rows) == {d.name for d in runs}
        for run_dir in runs:
            disk = _on_disk(run_dir)
            row = rows[run_dir.name]
            assert row["recorded"] == f"{sum(disk.values())} / {QUERIES}"
            assert row["completed"] == str(disk["completed"])
            assert row["state"] == "running"
        browser.screenshot(tmp_path / "watch-mid-run.png")

        # The run to stop has a query in flight; a query recorded so far opens in the
        # viewer, made from its record on disk.
        wait_for(
            "a run with a query in flight",
            lambda: any(_running([d]) for d in runs),
            explain=lambda: _statuses(runs) + file_tail(driver_log, 40),
        )
        stopped = next(d for d in runs if _running([d]))
        other = next(d for d in runs if d != stopped)
        row = f"document.querySelector('tr[data-name=\"{stopped.name}\"]')"
        key = browser.evaluate(row + ".dataset.run")
        recorded = _records(stopped)
        if recorded:
            body = _fetch(watch.url, f"run/{key}/viewer/q/0.js")
            assert f'"id":"{recorded[0]["query_id"]}"' in body

        # Stop it from the page's button: its held queries end, the other run's do not.
        before_other = _bytes(other)
        browser.evaluate(row + '.querySelector("button").click()')
        message = "document.getElementById('message').textContent"
        wait_for("the stop's answer", lambda: "stop requested" in browser.evaluate(message))
        wait_for("the run stopped", lambda: _state(stopped) == "stopped")

        def cut_records() -> list[dict]:
            return [r for r in _records(stopped) if r["termination"] == "stopped"]

        # Its queries in flight end as they are cut: each comes back as a record.
        wait_for("the stopped run's queries in flight recorded as cut", lambda: bool(cut_records()))
        cut = cut_records()
        assert all(r["status"] == "failed" and r["retryable"] for r in cut)
        assert _bytes(other)[: len(before_other)] == before_other
        provider.release()
        assert driver.wait(timeout=600) == 0, file_tail(driver_log, 40)
        # The page, never reloaded, shows the ends: a look made after the driver exited reads
        # the final files (one made just before may still show the run going).
        exited = _polls(browser)
        wait_for("the page's look after the sweep ended", lambda: _polls(browser) > exited + 1)
        final = _rows(browser)
        assert final[other.name]["recorded"] == f"{QUERIES} / {QUERIES}"
        assert final[stopped.name]["state"] == "stopped"
        assert final[other.name]["state"] == "finished"
    finally:
        if browser is not None:
            browser.close()
        if watch is not None:
            watch.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        provider.release()

    # The sweep again: the stopped run resumes (its cut queries too), the other is untouched.
    finished_other = _bytes(other)
    again = subprocess.run(
        _cli("sweep", str(sweep), "--runs-root", str(root)),
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    ids = [r["query_id"] for r in _records(stopped)]
    assert len(ids) == len(set(ids)) == QUERIES
    assert _bytes(other) == finished_other
    retried = _records(stopped, "records.retried.jsonl")
    assert {r["query_id"] for r in retried} == {r["query_id"] for r in cut}
    assert _state(stopped) == "finished"


def _fetch(base: str, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(base.split("?")[0] + path) as answer:
        return answer.read().decode()
