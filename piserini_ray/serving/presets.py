"""What each serving engine is: the command that starts its OpenAI-compatible server, the
path that says it is healthy, and the litellm route that calls it.

- llama.cpp: llama-cpp-python's server (`python -m llama_cpp.server`), which serves
  `/v1/chat/completions` and `/v1/models` (no `/health`); a GGUF file.
- vLLM: `vllm serve MODEL` (`/health`, `/v1/models`), called through litellm's
  `hosted_vllm/` route.
- SGLang: `python -m sglang.launch_server --model-path MODEL` (`/health`, `/v1/models`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from piserini_ray.config.serving import ROUTES, Engine, ServeConfig

#: A server's command: (serve settings, the weights' path or name, the name it answers to,
#: host, port) -> argv.
Command = Callable[[ServeConfig, str, str, str, int], list[str]]


def _python(serve: ServeConfig) -> str:
    return serve.executable or sys.executable


def _llama_cpp(serve: ServeConfig, model: str, name: str, host: str, port: int) -> list[str]:
    return [
        _python(serve),
        "-m",
        "llama_cpp.server",
        "--model",
        model,
        "--model_alias",
        name,
        "--host",
        host,
        "--port",
        str(port),
        *serve.args,
    ]


def _vllm(serve: ServeConfig, model: str, name: str, host: str, port: int) -> list[str]:
    return [
        serve.executable or "vllm",
        "serve",
        model,
        "--served-model-name",
        name,
        "--host",
        host,
        "--port",
        str(port),
        *serve.args,
    ]


def _sglang(serve: ServeConfig, model: str, name: str, host: str, port: int) -> list[str]:
    return [
        _python(serve),
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--served-model-name",
        name,
        "--host",
        host,
        "--port",
        str(port),
        *serve.args,
    ]


@dataclass(frozen=True)
class EnginePreset:
    """One engine: its command, its health path, the litellm route prefix that calls it, and
    how to tell whether it is installed (a module the engine's Python imports, or a command)."""

    engine: Engine
    command: Command
    health_path: str
    route: str
    #: The Python module that must import on the node (None: a command on the PATH).
    module: str | None
    #: Where the weights come from when `package:` is not used, for messages.
    weights: str


PRESETS: dict[str, EnginePreset] = {
    "llama.cpp": EnginePreset(
        "llama.cpp",
        _llama_cpp,
        "/v1/models",
        ROUTES["llama.cpp"],
        "llama_cpp.server",
        "a GGUF file",
    ),
    "vllm": EnginePreset("vllm", _vllm, "/health", ROUTES["vllm"], None, "a model folder"),
    "sglang": EnginePreset(
        "sglang", _sglang, "/health", ROUTES["sglang"], "sglang.launch_server", "a model folder"
    ),
}


def litellm_route(serve: ServeConfig, name: str) -> str:
    """What litellm is called with for a model of this name served by this engine."""
    return f"{PRESETS[serve.engine].route}/{name}"
