"""`serving/process.py` and the engines' presets against a stand-in engine process
(`stand_in_server.py`): the command each preset starts, the health and model checks it waits
for, and the messages of every way a server fails to come up (the engine missing, the weights
missing, a port taken, a server that exits, one that never answers, one that serves another
model), each naming the node and the engine, with the server's last log lines."""

from __future__ import annotations

import json
import socket
import stat
import sys
import urllib.request
from pathlib import Path

import pytest

from piserini_ray.config import load_config
from piserini_ray.config.serving import ServeConfig
from piserini_ray.errors import ConfigError
from piserini_ray.serving import ServeError, ServerProcess

STAND_IN = Path(__file__).with_name("stand_in_server.py")


@pytest.fixture
def argv_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "argv.json"
    monkeypatch.setenv("STAND_IN_ARGV", str(path))
    return path


def _vllm(tmp_path: Path) -> str:
    """A `vllm` command that is the stand-in."""
    command = tmp_path / "vllm"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STAND_IN}" "$@"\n')
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    return str(command)


def _sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An importable `sglang.launch_server` that is the stand-in."""
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STAND_IN.read_text())
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))


def test_the_vllm_preset_starts_its_server_and_waits_for_health_and_the_model(
    tmp_path: Path, argv_file: Path
) -> None:
    serve = ServeConfig(
        engine="vllm",
        model="Qwen/Qwen3-32B",
        executable=_vllm(tmp_path),
        args=["--max-model-len", "32768"],
    )
    server = ServerProcess(serve, "qwen3-32b", "node-a")
    base = server.start()
    try:
        argv = json.loads(argv_file.read_text())
        assert argv == [
            "serve",
            "Qwen/Qwen3-32B",
            "--served-model-name",
            "qwen3-32b",
            "--host",
            "127.0.0.1",
            "--port",
            str(server.port),
            "--max-model-len",
            "32768",
        ]
        with urllib.request.urlopen(base + "/models") as answer:
            assert json.load(answer)["data"][0]["id"] == "qwen3-32b"
        assert server.alive()
    finally:
        server.stop()
    assert not server.alive() and server.seconds_up() > 0


def test_the_sglang_preset_runs_its_module_with_the_engines_python(
    tmp_path: Path, argv_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sglang(tmp_path, monkeypatch)
    serve = ServeConfig(engine="sglang", model="/models/qwen3", args=["--tp", "2"])
    server = ServerProcess(serve, "qwen3", "node-b")
    server.start()
    server.stop()
    argv = json.loads(argv_file.read_text())
    assert argv[:2] == ["--model-path", "/models/qwen3"] and argv[-2:] == ["--tp", "2"]


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("exit", "exited with status 3 before it answered"),
        ("silent", "did not answer its health check within 2 s (serve.startup_timeout)"),
        ("wrong-name", "answers but serves ['another-model'], not 'qwen3-32b'"),
    ],
)
def test_a_server_that_does_not_come_up_is_named_with_its_last_lines(
    tmp_path: Path, argv_file: Path, monkeypatch: pytest.MonkeyPatch, mode: str, said: str
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", mode)
    serve = ServeConfig(
        engine="vllm", model="Qwen/Qwen3-32B", executable=_vllm(tmp_path), startup_timeout=2
    )
    server = ServerProcess(serve, "qwen3-32b", "gpu-node-7")
    with pytest.raises(ServeError) as error:
        server.start()
    message = str(error.value)
    assert "vllm server of qwen3-32b on node gpu-node-7" in message and said in message
    assert "stand-in engine starting with" in message  # its log's last lines
    if mode == "exit":
        assert "CUDA out of memory" in message
    assert not server.alive()  # nothing left running


def test_an_engine_that_is_not_installed_is_named_with_the_fix(tmp_path: Path) -> None:
    vllm = ServerProcess(
        ServeConfig(engine="vllm", model="m", executable=str(tmp_path / "no-vllm")), "m", "n1"
    )
    with pytest.raises(ServeError, match=r"vllm is not installed there .* serve.executable"):
        vllm.start()
    llama = ServerProcess(ServeConfig(engine="llama.cpp", model="m.gguf"), "m", "n2")
    with pytest.raises(ServeError, match=r"llama.cpp is not installed for .*make serving"):
        llama.start()


def test_missing_weights_and_a_taken_port_are_named(tmp_path: Path, argv_file: Path) -> None:
    gguf = ServeConfig(engine="llama.cpp", model=str(tmp_path / "none.gguf"))
    with pytest.raises(ServeError, match=r"none.gguf' is not a file on that node"):
        ServerProcess(gguf, "m", "n1").resolve_model()
    package = ServeConfig(engine="llama.cpp", model="package:no_such_weights_package")
    with pytest.raises(ServeError, match=r"the package no_such_weights_package could not"):
        ServerProcess(package, "m", "n1").resolve_model()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        serve = ServeConfig(engine="vllm", model="m", executable=_vllm(tmp_path))
        with pytest.raises(ConfigError, match=f"port {port} is taken"):
            ServerProcess(serve, "m", "n1", port=port).start()


def test_a_served_model_is_called_through_its_engines_route_with_no_key() -> None:
    from piserini_ray.llm.routes import route_facts
    from piserini_ray.preflight import preflight

    config = load_config(
        None,
        {"model.name": "qwen3-32b", "model.serve": {"engine": "vllm", "model": "Qwen/Qwen3-32B"}},
    )
    assert config.model.resolved_litellm_model() == "hosted_vllm/qwen3-32b"
    assert route_facts(config.model).variables == ()  # no key: its servers are the run's
    preflight(config)  # not in the pricing table: priced by server-hours, not refused


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ({"engine": "llama.cpp", "model": "m.gguf", "args": ["--port", "9"]}, "sets --port"),
        ({"engine": "tgi", "model": "m"}, "engine"),
    ],
)
def test_a_bad_serve_block_is_a_clear_error(block: dict, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        load_config(None, {"model.name": "m", "model.serve": block})
    both = {"model.name": "m", "model.api_base": "http://x/v1"}
    with pytest.raises(ConfigError, match="a served model is called at its own servers"):
        load_config(None, {**both, "model.serve": {"engine": "vllm", "model": "m"}})


def test_the_official_grader_config_starts_vllm_with_the_leaderboards_settings(
    tmp_path: Path, argv_file: Path
) -> None:
    """`configs/judges/qwen3-32b-vllm.yaml`: Qwen3-32B on vLLM, BrowseComp-Plus's sampling
    (temperature 0.7, top_p 0.8, top_k 20, thinking off) and its template; the command it
    starts, against the stand-in (no GPU here)."""
    config_file = tmp_path / "run.yaml"
    judge = Path(__file__).resolve().parents[2] / "configs" / "judges" / "qwen3-32b-vllm.yaml"
    config_file.write_text(f"judge: {{model: {judge}, template: browsecomp-plus}}\n")
    config = load_config(config_file)
    model = config.judge.model
    assert model is not None and model.serve is not None
    assert model.resolved_litellm_model() == "hosted_vllm/qwen3-32b"
    assert (model.temperature, model.extra["top_p"]) == (0.7, 0.8)
    assert model.extra["extra_body"] == {
        "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert config.judge.template == "browsecomp-plus"
    serve = model.serve.model_copy(update={"executable": _vllm(tmp_path)})
    server = ServerProcess(serve, model.name, "gpu-node")
    server.start()
    server.stop()
    argv = json.loads(argv_file.read_text())
    assert argv[:4] == ["serve", "Qwen/Qwen3-32B", "--served-model-name", "qwen3-32b"]
    assert argv[-4:] == ["--max-model-len", "32768", "--tensor-parallel-size", "2"]
