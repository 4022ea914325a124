"""One scrubber, by value: a key a provider echoes in its errors is in no file and no output,
whatever the name of the variable that holds it.

Each run is the command line as a user runs it (a subprocess, the local engine, a few sample
queries) against `EchoProvider`, which quotes the `Authorization` header it received in every
error body (500s, which are retried, and 400s, which are not). The key sits in `MY_THING`, a
name no secret-name rule would catch."""

from __future__ import annotations

import io
import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from echo_provider import EchoProvider

from piserini_ray.llm.scrubber import MASK, guard_output, hold, scrub, scrub_bytes


def _config(tmp_path: Path, base: str, tier: str = "standard") -> Path:
    path = tmp_path / f"{tier}.yaml"
    path.write_text(
        "model:\n"
        "  name: gpt-5\n"
        "  litellm_model: openai/gpt-5\n"
        f"  api_base: '{base}'\n"
        "  api_key_env: MY_THING\n"
        f"  service_tier: {tier}\n"
        "pricing: {allow_litellm_prices: true}\n"
        "slice: {sample: 3, seed: 1}\n"
        "retry: {max_attempts: 2, backoff_base: 0.01, backoff_cap: 0.01}\n"
        "runtime: {batch: {gather_seconds: 0.2, poll_seconds: 0.2}}\n"
        + ("agent: {termination: iterations, max_iterations: 4}\n" if tier == "batch" else "")
    )
    return path


def _cli(home: Path, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    # Only the key's own variable carries it: nothing named like a secret.
    env = {k: v for k, v in os.environ.items() if v != key}
    env |= {"PISERINI_RAY_HOME": str(home), "MY_THING": key}
    return subprocess.run(
        [sys.executable, "-m", "piserini_ray.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def _files_holding(root: Path, key: str) -> list[str]:
    return [
        str(path)
        for path in root.rglob("*")
        if path.is_file() and key.encode() in path.read_bytes()
    ]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")  # the sample's index is built once for the module


@pytest.mark.parametrize("tier", ["standard", "batch"])
def test_a_key_echoed_by_the_provider_is_in_no_file_and_no_output(
    tmp_path: Path, home: Path, tier: str
) -> None:
    key = f"canary-{secrets.token_hex(16)}"
    run_dir = tmp_path / "run"
    with EchoProvider() as provider:
        config = _config(tmp_path, provider.base_url, tier)
        out = _cli(home, key, "run", "--engine", "local", "--config", str(config),
                   "--run-dir", str(run_dir))  # fmt: skip
    # The key did go out, and came back in error bodies: the test has teeth.
    sent = [h for _m, _p, h in provider.requests if key in str(h)]
    assert len(sent) >= 2, (out.returncode, out.stderr[-3000:])
    assert (run_dir / "records.jsonl").is_file(), out.stderr[-3000:]
    assert key not in out.stdout and key not in out.stderr
    assert _files_holding(tmp_path, key) == [] and _files_holding(home, key) == []
    assert MASK in (run_dir / "records.jsonl").read_text()  # the echo is there, scrubbed


def test_a_key_echoed_by_a_refused_check_is_in_no_output(tmp_path: Path, home: Path) -> None:
    key = f"canary-{secrets.token_hex(16)}"
    with EchoProvider(answer_check=False) as provider:
        config = _config(tmp_path, provider.base_url)
        out = _cli(home, key, "run", "--check", "--config", str(config))
    assert out.returncode == 2 and "did not answer a one-word check" in out.stderr
    assert any(key in str(h) for _m, _p, h in provider.requests)
    assert key not in out.stdout and key not in out.stderr
    assert _files_holding(tmp_path, key) == []


def test_a_held_value_is_scrubbed_whatever_its_variable_is_called() -> None:
    value = f"held-{secrets.token_hex(8)}"
    assert scrub(f"x {value} y") == f"x {value} y"  # not known yet: nothing names it secret
    hold(value)
    assert scrub(f"x {value} y") == f"x {MASK} y"
    assert scrub_bytes(f'{{"e": "{value}"}}'.encode()) == f'{{"e": "{MASK}"}}'.encode()


def test_one_secret_name_rule_for_configs_and_the_scrubber() -> None:
    from piserini_ray.config import secret_rules as config_secrets
    from piserini_ray.llm import scrubber as llm_secrets

    assert llm_secrets.SECRET_NAME is config_secrets.SECRET_NAME


def test_log_records_are_scrubbed_whatever_their_handler_writes_to() -> None:
    value = f"logged-{secrets.token_hex(8)}"
    out = io.StringIO()
    logger = logging.getLogger(f"test-scrub-{value}")
    logger.addHandler(logging.StreamHandler(out))  # a file handler, as Ray's worker logs
    hold(value)
    guard_output()
    try:
        raise ValueError(f"the provider said {value}")
    except ValueError:
        logger.exception("call failed with key %s", value)
    assert value not in out.getvalue() and MASK in out.getvalue()
    assert "the provider said" in out.getvalue()  # the traceback is there, scrubbed
