"""Failure policy and exit status (issue 25): a run whose queries keep failing stops early and
exits non-zero with the top causes; `resume --retry-failed` after the fix completes it, with
nothing run twice; a configuration failure (a missing key) is never a query failure: exit 2,
no record."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from piserini_ray.cli import main
from piserini_ray.offline import OfflineConfig
from piserini_ray_testkit import EmulatedProvider, Scripted


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "records.jsonl"
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _config(tmp_path: Path, index_root: Path, api_base: str, **model: str) -> Path:
    path = tmp_path / "run.yaml"
    fields = ", ".join(f"{k}: {v}" for k, v in model.items())
    path.write_text(
        f"model: {{name: gpt-5, litellm_model: openai/gpt-5, api_base: '{api_base}'"
        + (f", {fields}" if fields else "")
        + "}\n"
        "slice: {sample: 12, seed: 5}\n"
        f"retrieval: {{index_root: '{index_root}'}}\n"
        "retry: {max_attempts: 1}\n"
        "judge: {model: {name: offline/exact-match-judge}}\n"
        "runtime: {max_failure_rate: 0.2}\n"
    )
    return path


def test_a_failing_provider_stops_the_run_and_retry_failed_completes_it_once(
    tmp_path: Path, index_root: Path, sample_index: Path, capsys
) -> None:
    served = OfflineConfig(model_aliases={"gpt-5": "offline/heuristic"})
    run_dir = tmp_path / "run"
    with EmulatedProvider(served) as provider:
        config = _config(tmp_path, index_root, provider.base_url)
        # The model check goes through (a pass-through script entry), then every call fails:
        # a provider outage.
        outage = [Scripted(kind="http_error", status=500, model="gpt-5")] * 100
        provider.script(Scripted(kind="latency", seconds=0, model="gpt-5"), *outage)
        status = main(["run", "--engine", "local", "--concurrency", "1", "--config", str(config),
                       "--run-dir", str(run_dir)])  # fmt: skip
        first = _records(run_dir)
        err = capsys.readouterr().err
        assert status == 1, err[-3000:]
        failed = [r for r in first if r["status"] == "failed"]
        # 12 to do, 20 %: the third failure passes the rate; no query starts after it.
        assert len(failed) == 3 and len(first) == 3, [r["status"] for r in first]
        assert "more than runtime.max_failure_rate (20%)" in err and "Top causes" in err
        # The fix: the provider answers again; --retry-failed runs the failed queries and the
        # rest, each once.
        provider.reset()
        status = main(["resume", str(run_dir), "--engine", "local", "--concurrency", "1",
                       "--retry-failed"])  # fmt: skip
        err = capsys.readouterr().err
        assert status == 0, err[-3000:]
        assert "3 failed queries run again (--retry-failed)" in err
        asked = {str(m) for r in provider.requests for m in [r.conversation]}
    records = _records(run_dir)
    ids = [r["query_id"] for r in records]
    assert len(ids) == len(set(ids)) == 12  # every query once
    assert all(r["status"] != "failed" for r in records)
    retried = _records_file(run_dir / "records.retried.jsonl")
    assert sorted(r["query_id"] for r in retried) == sorted(r["query_id"] for r in failed)
    assert len(asked) >= 12  # the resumed run's conversations: one per query left


def _records_file(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def test_a_missing_key_is_a_configuration_failure_not_a_query_failure(
    tmp_path: Path, index_root: Path, sample_index: Path, capsys
) -> None:
    os.environ.pop("PISERINI_NEVER_SET_KEY", None)
    served = OfflineConfig(model_aliases={"gpt-5": "offline/heuristic"})
    with EmulatedProvider(served) as provider:
        config = _config(
            tmp_path, index_root, provider.base_url, api_key_env="PISERINI_NEVER_SET_KEY"
        )
        status = main(["run", "--engine", "local", "--config", str(config),
                       "--run-dir", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert "PISERINI_NEVER_SET_KEY" in err and "export" in err
    assert _records(tmp_path / "run") == []  # no failed record: nothing to resume around
