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


def _server(launcher: Callable[[ServeConfig], list[str]], model: str | None, name: str) -> Command:
    """An engine's command: its launcher, the weights (after the `model` flag, or as the first
    argument), the name it answers to (after `name`), the address, then `serve.args`."""

    def command(serve: ServeConfig, weights: str, served: str, host: str, port: int) -> list[str]:
        given = [model, weights] if model else [weights]
        address = ["--host", host, "--port", str(port)]
        return [*launcher(serve), *given, name, served, *address, *serve.args]

    return command


_llama_cpp = _server(
    lambda serve: [_python(serve), "-m", "llama_cpp.server"], "--model", "--model_alias"
)
_vllm = _server(lambda serve: [serve.executable or "vllm", "serve"], None, "--served-model-name")
_sglang = _server(
    lambda serve: [_python(serve), "-m", "sglang.launch_server"],
    "--model-path",
    "--served-model-name",
)


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
