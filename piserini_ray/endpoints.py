"""Which API base serves a model: the one owner of that question for both engines, the judge,
`ask` and the model check.

A model the run serves (`model.serve`) is served by its server, started here on first use (the
local engine; the Ray engine places its servers as actors). A model with an `api_base` is
served there. An offline model without one (or a provider's model
name in `offline.model_aliases`: `OfflineConfig.serves`) is served by the loopback offline
provider of the run's `offline` settings, started here on first use (one per
distinct settings, so runs and judges that share them share its quotas and its bill) and
stopped when the endpoints close.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from piserini_ray.config import ModelConfig, OfflineConfig
from piserini_ray.llm.routes import route_provider

if TYPE_CHECKING:
    from piserini_ray.serving import ServerProcess


class ModelEndpoints:
    """A job's endpoints; a context manager (the offline providers stop on exit)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._started: dict[str, str] = {}
        self._lock = threading.Lock()  # the Ray engine asks from its bring-up thread too
        #: The model servers started here (`model.serve`), for their hours.
        self.servers: list[ServerProcess] = []

    def api_base(self, model: ModelConfig, offline: OfflineConfig) -> str | None:
        if model.serve is not None:
            return self._serve(model)
        if not offline.serves(model):
            return model.api_base
        key = offline.model_dump_json()
        with self._lock:
            if key not in self._started:
                from piserini_ray.offline import OfflineProvider  # aiohttp: only when needed

                provider = self._stack.enter_context(OfflineProvider(offline))
                self._started[key] = provider.base_url
            base = self._started[key]
        # litellm's Anthropic route adds `/v1/messages` to the host itself.
        return base.removesuffix("/v1") if route_provider(model) == "anthropic" else base

    def _serve(self, model: ModelConfig) -> str:
        """A model the run serves (`model.serve`), on this machine: its server started on
        first use (one, whatever `serve.replicas` says: the Ray engine places the replicas),
        stopped when the endpoints close."""
        assert model.serve is not None
        key = model.model_dump_json(include={"name", "serve"})
        with self._lock:
            if key not in self._started:
                import socket

                from piserini_ray.serving import ServerProcess

                server = ServerProcess(model.serve, model.name, socket.gethostname())
                self._started[key] = server.start()
                self._stack.callback(server.stop)
                self.servers.append(server)
                # A server that exits starts again at the same address (its calls retry).
                threading.Thread(
                    target=server.supervise, args=(_say,), name="serve-supervise", daemon=True
                ).start()
            return self._started[key]

    def close(self) -> None:
        with self._lock:
            self._started.clear()
            self._stack.close()

    def __enter__(self) -> ModelEndpoints:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()


def _say(message: str) -> None:
    print(f"[piserini-ray] {message}", file=sys.stderr, flush=True)
