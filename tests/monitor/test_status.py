"""The live status of a run without any engine: the board over a real run store (its counts,
cost, retries and verdicts are the files'), staleness, stop requests, the status table, the
progress lines, and the web view's guards (a token, a port taken, a path with no run)."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from piserini_ray.cli.monitor import status_row
from piserini_ray.config import RunConfig
from piserini_ray.metrics.cost import Price
from piserini_ray.monitor.board import StatusBoard, final_status, retry_class, wilson
from piserini_ray.monitor.status import (
    STOP_FILE,
    MonitorError,
    read_status,
    request_stop,
    run_dirs_under,
    view,
)
from piserini_ray.monitor.web import start_watch
from piserini_ray.progress import Progress, eta_text
from piserini_ray.records import Judgement, QueryRecord, Turn, Usage, now_iso
from piserini_ray.store import RunStore

PRICE = Price(input=1.0, output=10.0, cache_read=0.1)


def _record(
    store: RunStore, query_id: str, status: str = "completed", **more: object
) -> QueryRecord:
    return QueryRecord(
        run_id=store.run_id, config_hash=store.config_hash, query_id=query_id, model="m",
        status=status, started_at=now_iso(), finished_at=now_iso(), **more,  # type: ignore[arg-type]
    )  # fmt: skip


def _board(store: RunStore, wanted: set[str], log: list[str]) -> StatusBoard:
    board = StatusBoard(store, RunConfig(), PRICE, wanted, len(wanted), log.append, every=0.5)
    store.listeners.append(board)
    return board


def test_the_board_counts_what_the_store_writes(tmp_path: Path) -> None:
    log: list[str] = []
    wanted = {"q1", "q2", "q3", "q4"}
    usage = Usage(input_tokens=1000, output_tokens=100, cached_tokens=500)
    turn = Turn(
        index=1,
        model_output=None,
        retries=["rate_limit, waiting 1.00 s: 429", "transient, waiting 2.00 s: 503"],
    )
    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.append(_record(store, "q1", usage=usage, trajectory=[turn]))  # before the board
        board = _board(store, wanted, log)
        assert board.status.recorded == {"completed": 1}
        store.append(_record(store, "q2", "timeout", usage=usage))
        store.append(_record(store, "elsewhere"))  # not of the slice: not counted
        judge = RunConfig().judge_model().name
        for query_id, correct in (("q1", True), ("q2", False)):
            store.append_judgement(
                Judgement(query_id=query_id, judge_model=judge, status="judged", correct=correct)
            )
        board.live(running=2, waiting=1, replicas={"10.0.0.2": 1})
        board.close("running")
    seen = read_status(tmp_path / "run")
    assert seen is not None and not seen.stale
    status = seen.status
    assert status.recorded == {"completed": 1, "timeout": 1} and status.recorded_total == 2
    assert status.ran_now == 1 and status.todo_at_start == 4 and status.queries == 4
    assert status.retries == {"rate_limit": 1, "transient": 1}
    assert status.tokens["input_tokens"] == 2000 and status.tokens["output_tokens"] == 200
    assert status.cost_usd == pytest.approx(2 * PRICE.cost(usage))
    assert (status.judged, status.correct, status.accuracy_judged) == (2, 1, 0.5)
    assert status.accuracy_ci95 == wilson(1, 2)
    assert status.replicas == {"10.0.0.2": 1} and status.running == 0  # ended: none in flight


def test_the_final_status_is_the_reports_and_keeps_a_stop(tmp_path: Path) -> None:
    log: list[str] = []
    with RunStore(tmp_path / "run", RunConfig()) as store:
        board = _board(store, {"q1", "q2"}, log)
        store.append(_record(store, "q1"))
        board.stop_requested = True
        board.close("stopped", "asked")
        final = final_status(store, RunConfig(), PRICE, {"q1", "q2"}, (0.1, 0.9), log.append)
    assert final.state == "stopped" and final.stopped == "asked"  # q2 has no record yet
    assert read_status(tmp_path / "run").status.accuracy_ci95 == (0.1, 0.9)  # type: ignore[union-attr]


def test_a_stop_request_reaches_the_board_and_a_stale_one_is_cleared(tmp_path: Path) -> None:
    log: list[str] = []
    with RunStore(tmp_path / "run", RunConfig()) as store:
        board = _board(store, {"q1"}, log).start()
        request_stop(tmp_path / "run")
        board._tick()  # what its thread does every half second
        assert board.stop_requested and "stop requested" in log[-1]
        board.close("stopped")
        assert not (tmp_path / "run" / STOP_FILE).exists()  # honoured: done with
        (tmp_path / "run" / STOP_FILE).write_text("{}")  # left by a driver that died
        again = _board(store, {"q1"}, log)
        assert not again.stop_requested and "cleared" in log[-1]
        again.close("finished")
    with pytest.raises(MonitorError, match="is finished: there is nothing to stop"):
        request_stop(tmp_path / "run")
    with pytest.raises(MonitorError, match="not a run directory"):
        request_stop(tmp_path)


def test_a_status_whose_driver_is_gone_is_stale(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        board = _board(store, {"q1"}, [])
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = board.status.model_copy(update={"pid": int(gone.stdout)})
    assert view(dead).stale and view(dead).state == "stale"
    assert not view(board.status).stale  # this process writes it
    old = board.status.model_copy(
        update={"updated_at": "2026-01-01T00:00:00+00:00", "host": "elsewhere"}
    )
    assert view(old).stale
    row = status_row("run", view(dead))
    assert row[1].startswith("stale (last written")


def test_a_live_run_with_nothing_new_is_rewritten_and_never_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's run that waits its turn (or is done while the others go on) changes nothing
    for minutes; its driver lives, so it must not read as stale (seen on a live sweep: two of
    four runs 'stale' mid-run). The staleness floor is shortened so that a heartbeat comes
    within the test."""
    monkeypatch.setattr("piserini_ray.monitor.status.STALE_FLOOR", 1.0)
    with RunStore(tmp_path / "run", RunConfig()) as store:
        board = _board(store, {"q1"}, []).start()
        try:
            writes: list[str] = []

            def rewritten() -> bool:
                seen = read_status(tmp_path / "run")
                assert seen is not None and not seen.stale, seen
                if not writes or seen.status.updated_at != writes[-1]:
                    writes.append(seen.status.updated_at)
                return len(writes) >= 4

            wait_for("three heartbeats of a run with nothing new", rewritten, deadline_s=60)
            assert board.status.recorded == {} and board.status.state == "running"
        finally:
            board.close("running")


def test_the_pace_counts_from_the_runs_first_query_in_flight(tmp_path: Path) -> None:
    """A sweep's run that waited its turn: its pace (and ETA) count from when its first query
    was in flight, not from when the sweep began."""
    with RunStore(tmp_path / "run", RunConfig()) as store:
        board = _board(store, {"q1", "q2"}, [])
        board.live(running=0, waiting=0)  # the sweep's other runs go first
        assert board._began is None and board._pace() is None
        board.live(running=1)
        began = board._began
        assert began is not None
        store.append(_record(store, "q1"))
        board.live(running=0)
        board.live(running=1)  # a later query in flight does not move the start
        assert board._began == began and board._pace() is not None
        board.close("running")


def test_a_recorded_query_is_no_longer_counted_in_flight(tmp_path: Path) -> None:
    """Between two looks of the engine, a query's record takes it out of the queries in flight:
    no status counts a query both recorded and running."""
    with RunStore(tmp_path / "run", RunConfig()) as store:
        board = _board(store, {"q1", "q2", "q3"}, [])
        board.live(running=2)
        store.append(_record(store, "q1"))
        assert (board.status.running, board.status.recorded_total) == (1, 1)
        store.append(_record(store, "q2"))
        store.append(_record(store, "q3"))  # started and ended between two looks
        assert (board.status.running, board.status.recorded_total) == (0, 3)
        board.close("running")


def test_paths_with_no_run_are_named(tmp_path: Path) -> None:
    with pytest.raises(MonitorError, match="no run under"):
        run_dirs_under(tmp_path)
    with pytest.raises(MonitorError, match="is not a folder"):
        run_dirs_under(tmp_path / "missing")
    with pytest.raises(MonitorError, match="no run under"):
        start_watch(tmp_path, port=0)


def test_progress_has_an_eta_and_a_line_per_run() -> None:
    assert eta_text(0, 10, 5.0) == "ETA ?"
    assert eta_text(5, 10, 50.0) == "ETA 50 s"
    assert eta_text(1, 10, 100.0) == "ETA 15 min 0 s"
    assert eta_text(10, 10, 1.0) == "ETA 0 s"
    progress = Progress(4)
    progress.add_run("a", 2)
    progress.add_run("b", 2)
    progress.record("completed", Usage(), 0.5, run="a")
    progress.record("failed", Usage(), None, run="b")
    first, a, b = progress.lines()
    assert "2/4 done" in first and "ETA" in first
    assert a == "  a: 1/2 done | failed 0 | timeouts 0 | cost $0.50"
    assert b == "  b: 1/2 done | failed 1 | timeouts 0 | cost $0.00+"


def _get(url: str, **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_web_view_guards_its_token_and_its_port(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.append(_record(store, "q1"))
        board = _board(store, {"q1", "q2"}, [])
        closed = start_watch(tmp_path, port=0, require_token=True)
        try:
            base = closed.url.split("?")[0]
            assert _get(base + "api/runs")[0] == 401
            status, body = _get(base + "api/runs", **{"X-Piserini-Token": closed.token})
            assert status == 200
            (run,) = orjson.loads(body)["runs"]
            assert run["records"] == {"total": 1, "completed": 1} and run["state"] == "running"
            with pytest.raises(MonitorError, match="is taken"):
                start_watch(tmp_path, port=closed.server.server_address[1])
        finally:
            closed.close()
        opened = start_watch(tmp_path, port=0)  # loopback: reads are open, a stop is not
        try:
            base = opened.url.split("?")[0]
            assert _get(base + "api/runs")[0] == 200
            stop = urllib.request.Request(base + "api/stop", data=b'{"run": "x"}', method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(stop)
            assert refused.value.code == 401
            assert not (tmp_path / "run" / STOP_FILE).exists()
        finally:
            opened.close()
        board.close("finished")


def test_retry_classes() -> None:
    assert retry_class("rate_limit, waiting 1.00 s: too many") == "rate_limit"
    assert retry_class("transient: boom") == "transient"
    assert wilson(0, 0) is None
    low, high = wilson(50, 100)  # type: ignore[misc]
    assert low < 0.5 < high and round(high - 0.5, 3) == round(0.5 - low, 3)


def test_stop_waits_for_the_run_to_stop_or_says_it_did_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading

    from piserini_ray.cli import main

    run = tmp_path / "run"
    with RunStore(run, RunConfig()) as store:
        board = _board(store, {"q1"}, [])  # not started: nothing honours the request
        assert main(["stop", str(run), "--timeout", "0.6"]) == 1
        out = capsys.readouterr().out
        assert "stop requested" in out and "did not stop within 0.6 s" in out
        threading.Timer(0.3, board.close, args=("stopped", "asked")).start()
        assert main(["stop", str(run), "--timeout", "30"]) == 0
        assert f"{run}: stopped, 0/1 recorded" in capsys.readouterr().out
