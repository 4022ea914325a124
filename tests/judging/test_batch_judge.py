"""The batch judge (issue 22): `judge.model.service_tier: batch` judges every answer through
OpenAI's Batch API or Anthropic's Message Batches (the offline provider's emulators, reached
through litellm's batches and files calls): the same verdicts as the standard judge at half the
judge's bill; errored and expired requests go into the next batch and are never scored wrong; a
driver killed while a batch is in flight resumes polling that batch and never sends a second
one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from piserini_ray.cli import main
from piserini_ray.config.offline import BatchConfig
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.offline import OfflineConfig
from piserini_ray.records import Usage
from piserini_ray_testkit import BatchFates, EmulatedProvider

QUERIES = 6
#: Each judge by its name in the pricing table, and its litellm route.
JUDGES = {"gpt-5": "openai/gpt-5", "claude-haiku-4.5": "anthropic/claude-haiku-4-5"}


def _config(
    tmp_path: Path, index_root: Path, judge_base: str, tier: str, name: str, judge: str = "gpt-5"
) -> Path:
    route, base = JUDGES[judge], judge_base
    if route.startswith("anthropic/"):  # litellm's Anthropic route adds /v1/messages itself
        route, base = f"{route}, max_output_tokens: 1024", judge_base.removesuffix("/v1")
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"slice: {{sample: {QUERIES}, seed: 4}}\n"
        f"retrieval: {{index_root: '{index_root}'}}\n"
        f"judge: {{model: {{name: {judge}, litellm_model: {route}, api_base: '{base}', "
        f"service_tier: {tier}}}, batch_poll_seconds: 0.05}}\n"
    )
    return path


def _verdicts(run_dir: Path, judge: str = "gpt-5") -> dict[str, dict]:
    rows = [
        orjson.loads(x)
        for x in (run_dir / "judgements" / f"{judge}.jsonl").read_bytes().split(b"\n")
        if x
    ]
    return {r["query_id"]: r for r in rows}


def _run(config: Path, run_dir: Path) -> int:
    return main(["run", "--engine", "local", "--concurrency", "3", "--config", str(config),
                 "--run-dir", str(run_dir)])  # fmt: skip


def _served(batch: BatchConfig) -> OfflineConfig:
    judge = "offline/exact-match-judge"
    return OfflineConfig(model_aliases={"gpt-5": judge, "claude-haiku-4-5": judge}, batch=batch)


@pytest.mark.parametrize("judge", list(JUDGES))
def test_the_batch_judge_gives_the_standard_verdicts_at_half_the_bill(
    tmp_path: Path, index_root: Path, sample_index: Path, judge: str
) -> None:
    with EmulatedProvider(_served(BatchConfig(completion_seconds=0.2))) as provider:
        for tier in ("standard", "batch"):
            config = _config(tmp_path, index_root, provider.base_url, tier, tier, judge)
            assert _run(config, tmp_path / tier) == 0
        bill = provider.bill
        batches = {r.batch_id for r in provider.requests if r.batch_id is not None}
    standard, batch = _verdicts(tmp_path / "standard", judge), _verdicts(tmp_path / "batch", judge)
    answered = [q for q, v in standard.items() if v["attempts"] > 0]  # judged by a call
    assert len(standard) == len(batch) == QUERIES and answered
    assert {q: v["correct"] for q, v in batch.items()} == {
        q: v["correct"] for q, v in standard.items()
    }
    assert all(v["status"] == "judged" for v in batch.values())
    # The same tokens, billed at the batch tier: half the price.
    line = bill[("batch", JUDGES[judge].split("/")[1])]
    assert line.requests == len(answered) and len(batches) == 1
    if judge.startswith("claude"):  # Anthropic's Message Batches, not OpenAI's Batch API
        assert all(b.startswith("msgbatch_") for b in batches)
    price = load_pricing().price(judge)
    batch_price = load_pricing().price(judge, "batch")
    assert price is not None and batch_price is not None
    billed = Usage(input_tokens=line.prompt_tokens, cached_tokens=line.cached_tokens,
                   output_tokens=line.completion_tokens)  # fmt: skip
    recorded = sum((Usage.model_validate(v["usage"]) for v in batch.values()), Usage())
    assert (recorded.input_tokens, recorded.output_tokens) == (line.prompt_tokens,
                                                               line.completion_tokens)  # fmt: skip
    assert (
        batch_price.cost(billed) == pytest.approx(0.5 * price.cost(billed)) and billed.input_tokens
    )
    summary = orjson.loads((tmp_path / "batch" / "summary.json").read_bytes())
    assert summary["judge_cost_usd"] == pytest.approx(batch_price.cost(recorded), abs=1e-4)
    assert "batch tier" in summary["pricing_source"][judge]
    # The ledger: every batch written, then closed.
    ledger = [
        orjson.loads(x)
        for x in (tmp_path / "batch" / "batches.jsonl").read_bytes().split(b"\n")
        if x
    ]
    created = [r["batch_id"] for r in ledger if "batch_id" in r]
    assert created and sorted(created) == sorted(r["closed"] for r in ledger if "closed" in r)


@pytest.mark.parametrize("judge", list(JUDGES))
def test_errored_and_expired_requests_go_into_the_next_batch_never_scored_wrong(
    tmp_path: Path, index_root: Path, sample_index: Path, judge: str
) -> None:
    rough = BatchFates(error_rate=0.3, expire_rate=0.3)
    with EmulatedProvider(
        _served(BatchConfig(completion_seconds=0.1)), batch_fates=rough
    ) as provider:
        config = _config(tmp_path, index_root, provider.base_url, "batch", "rough", judge)
        assert _run(config, tmp_path / "rough") == 0
        requests = [r for r in provider.requests if r.batch_id is not None]
    with EmulatedProvider(_served(BatchConfig())) as provider:
        config = _config(tmp_path, index_root, provider.base_url, "standard", "calm", judge)
        assert _run(config, tmp_path / "calm") == 0
    ledger = [
        orjson.loads(x)
        for x in (tmp_path / "rough" / "batches.jsonl").read_bytes().split(b"\n")
        if x
    ]
    batches = {r["batch_id"] for r in ledger if "batch_id" in r}
    assert len(batches) >= 2  # something errored or expired, and went into a next batch
    rough_verdicts, calm = _verdicts(tmp_path / "rough", judge), _verdicts(tmp_path / "calm", judge)
    assert all(v["status"] == "judged" for v in rough_verdicts.values())
    assert {q: v["correct"] for q, v in rough_verdicts.items()} == {
        q: v["correct"] for q, v in calm.items()
    }
    assert len({r.batch_id for r in requests}) == len(batches)


@pytest.mark.slow  # a driver process started, killed and resumed
def test_a_driver_killed_while_its_batch_is_in_flight_resumes_polling_that_batch(
    tmp_path: Path, index_root: Path, sample_index: Path
) -> None:
    run_dir = tmp_path / "run"
    with EmulatedProvider(_served(BatchConfig(completion_seconds=8))) as provider:
        config = _config(tmp_path, index_root, provider.base_url, "batch", "killed")
        driver = subprocess.Popen(
            [sys.executable, "-m", "piserini_ray.cli", "run", "--engine", "local", "--config",
             str(config), "--run-dir", str(run_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        ledger = run_dir / "batches.jsonl"
        try:

            def created() -> bool:
                assert driver.poll() is None, driver.stderr.read().decode()[-3000:]
                return ledger.exists() and bool(ledger.read_bytes().strip())

            wait_for("the driver's batch line", created, 300)
            os.kill(driver.pid, signal.SIGKILL)
        finally:
            driver.wait(30)
        (sent,) = [orjson.loads(x)["batch_id"] for x in ledger.read_bytes().split(b"\n") if x]
        assert not (run_dir / "judgements" / "gpt-5.jsonl").exists() or not any(
            v["attempts"] for v in _verdicts(run_dir).values()
        )
        # Resume: the judge polls the batch it sent, and sends no other.
        assert main(["judge", str(run_dir)]) == 0
        created = {r.batch_id for r in provider.requests if r.batch_id is not None}
    assert created == {sent}
    verdicts = _verdicts(run_dir)
    assert len(verdicts) == QUERIES and all(v["status"] == "judged" for v in verdicts.values())
    rows = [orjson.loads(x) for x in ledger.read_bytes().split(b"\n") if x]
    assert rows[-1] == {"judge_model": "gpt-5", "closed": sent}


def test_a_batch_judge_on_a_route_without_batches_is_a_config_error(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "judge: {model: {name: deepseek-v4-flash, service_tier: batch, api_key_env: HOME}}\n"
    )
    assert main(["run", "--engine", "local", "--config", str(config),
                 "--run-dir", str(tmp_path / "r")]) == 2  # fmt: skip
    assert "goes through the openai and anthropic routes only" in capsys.readouterr().err
