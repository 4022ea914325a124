"""`run --check` and the automatic check before a run: a wrong key, a wrong model and a dead
endpoint each stop with exit 2 and the provider's message, before any query is run."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from piserini_ray.cli import main
from piserini_ray.offline import OfflineConfig
from piserini_ray_testkit import EmulatedProvider, Scripted


def _config(tmp_path: Path, api_base: str, name: str = "gpt-check") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"model: {{name: {name}, litellm_model: openai/{name}, api_base: '{api_base}'}}\n"
        "pricing: {allow_litellm_prices: true}\n"
        "judge: {model: {name: offline/exact-match-judge}}\n"
    )
    return path


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


@pytest.mark.parametrize("fault", ["wrong key", "wrong model", "dead endpoint"])
def test_run_check_stops_with_exit_2_and_the_reason(tmp_path: Path, capsys, fault: str) -> None:
    with EmulatedProvider(OfflineConfig(model_aliases={"gpt-check": "offline/heuristic"})) as p:
        base = p.base_url
        if fault == "wrong key":
            p.script(Scripted(kind="auth_error"))
        name = "no-such-model" if fault == "wrong model" else "gpt-check"
        if fault == "dead endpoint":
            base = f"http://127.0.0.1:{_dead_port()}/v1"
        status = main(["run", "--check", "--config", str(_config(tmp_path, base, name))])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "did not answer a one-word check, so nothing was run" in err
    expected = {"wrong key": "uthentication", "wrong model": "does not exist",
                "dead endpoint": "onnect"}[fault]  # fmt: skip
    assert expected in err
    assert not (tmp_path / "runs").exists()


def test_run_check_passes_for_a_live_model(tmp_path: Path, capsys) -> None:
    with EmulatedProvider(OfflineConfig(model_aliases={"gpt-check": "offline/heuristic"})) as p:
        assert main(["run", "--check", "--config", str(_config(tmp_path, p.base_url))]) == 0
        assert len(p.requests) == 1  # one tiny request, no run
    assert "checked gpt-check" in capsys.readouterr().err
