"""Judging beside the queries (`engines/ray/judge_alongside.py`): on the Ray engine, `run` judges
each answer as its record is written, while the other queries still wait on the model; every
answer ends with exactly one verdict."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from piserini_ray.config import OFFLINE_JUDGE, load_config
from piserini_ray.offline import OfflineConfig
from piserini_ray.pipeline import make_engine, run_and_report
from piserini_ray.tools.spill import safe_component
from piserini_ray_testkit import EmulatedProvider

pytestmark = pytest.mark.usefixtures("module_ray")

QUERIES = 10
#: Model turns per query at most (`agent.max_iterations`; the offline model answers in 4 to
#: 10), and the requests answered before the provider holds the rest: the check, then enough
#: turns on the two slots that at least one query has ended (a slot with more than `TURNS`
#: calls has finished its first query), far fewer than the run's (at least 4 per query).
TURNS = 8
ANSWERED = 1 + 2 * TURNS + 1


def _lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_answers_are_judged_while_other_queries_still_run_and_each_once(
    sample_index: Path, index_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISERINI_ALONGSIDE_KEY", "sk-alongside-test")
    served = OfflineConfig(model_aliases={"gpt-5.4-mini": "offline/heuristic"})
    run_dir = tmp_path / "run"
    logged: list[str] = []
    with EmulatedProvider(served) as provider:  # the agent's; the judge has its own, never held
        config = load_config(
            None,
            {
                "retrieval.index_root": str(index_root),
                "slice.sample": QUERIES,
                "runtime.replicas": 1,
                "runtime.max_concurrency": 2,
                "agent.termination": "both",
                "agent.max_iterations": TURNS,
                "model": {
                    "name": "gpt-5.4-mini",
                    "litellm_model": "openai/gpt-5.4-mini",
                    "api_base": provider.base_url,
                    "api_key_env": "PISERINI_ALONGSIDE_KEY",
                },
            },
        )
        provider.hold(after=ANSWERED)
        failed: list[BaseException] = []

        def run() -> None:
            try:
                run_and_report([(config, run_dir)], make_engine("ray"), logged.append, print)
            except BaseException as exc:  # the test thread says it
                failed.append(exc)

        job = threading.Thread(target=run)
        job.start()
        try:
            # Both slots wait on the held provider: no record is written until it lets go.
            assert provider.wait_held(count=2, timeout=240), logged
            records = _lines(run_dir / "records.jsonl")
            assert records, "a query has ended before the hold"
            judgements = run_dir / "judgements" / f"{safe_component(OFFLINE_JUDGE)}.jsonl"
            ended = {r["query_id"] for r in records}
            wait_for(
                "the verdicts of the answers written",
                lambda: {j["query_id"] for j in _lines(judgements)} == ended,
                deadline_s=60,
            )
            assert len(ended) < QUERIES  # judged while the other queries were still running
        finally:
            provider.release()
            job.join()
    assert not failed, failed
    verdicts = [j["query_id"] for j in _lines(judgements)]
    assert sorted(verdicts) == sorted({r["query_id"] for r in _lines(run_dir / "records.jsonl")})
    assert len(verdicts) == QUERIES  # each once: the judging after the run had nothing left
    assert any(m.endswith("answers judged while the queries ran") for m in logged), logged
    assert not any(m.startswith("judging ") for m in logged), logged
