"""Which API base serves a model: the one owner of that question for both engines, the judge,
`ask` and the model check.

A model the run serves (`model.serve`) is served by its servers, started on first use: on
this machine, or where the engine places them (`Place`: the Ray engine places a judge's on
the cluster), and stopped when the endpoints close. A served judge's hours are then charged
to the runs it judged (`judging`), shared equally, as judge cost (`served.jsonl`, role
`judge`); an agent's are charged by its engine.

A model with an `api_base` is served there. An offline model without one (or a provider's
model name in `offline.model_aliases`: `OfflineConfig.serves`) is served by the loopback
offline provider of the run's `offline` settings, started here on first use (one per distinct
settings, so runs and judges that share them share its quotas and its bill) and stopped when
the endpoints close.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from piserini_ray.config import ModelConfig, OfflineConfig
from piserini_ray.llm.routes import route_provider
from piserini_ray.records import ServedTime
from piserini_ray.serving import served_key

if TYPE_CHECKING:
    from piserini_ray.store import RunStore

#: Stops a served model's servers: how long they were up (seconds) and how many there were.
StopServers = Callable[[], tuple[float, int]]
#: Starts a served model's servers: the address its calls go to, and how to stop them.
Place = Callable[[ModelConfig], tuple[str, StopServers]]


class ModelEndpoints:
    """A job's endpoints; a context manager (the offline providers and the model servers stop
    on exit). `place`: where a served model's servers start (default: this machine)."""

    def __init__(self, place: Place | None = None) -> None:
        self._stack = contextlib.ExitStack()
        self._started: dict[str, str] = {}
        self._lock = threading.Lock()  # the Ray engine asks from its bring-up thread too
        self._place = place or serve_here
        #: The served models started, by `served_key`: the model and how to stop its servers.
        self._served: dict[str, tuple[ModelConfig, StopServers]] = {}
        #: The runs each served judge judged, by `served_key`: who pays its hours.
        self._judged: dict[str, dict[str, RunStore]] = {}

    def api_base(
        self, model: ModelConfig, offline: OfflineConfig, judging: RunStore | None = None
    ) -> str | None:
        """`judging`: the run that `model` judges (a served judge's hours are charged to it)."""
        if model.serve is not None:
            return self._serve(model, judging)
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

    def _serve(self, model: ModelConfig, judging: RunStore | None) -> str:
        """A model the run serves (`model.serve`): its servers started on first use (`place`),
        stopped when the endpoints close."""
        key = served_key(model)
        with self._lock:
            if key not in self._started:
                self._started[key], stop = self._place(model)
                self._served[key] = (model, stop)
            if judging is not None:
                self._judged.setdefault(key, {})[str(judging.run_dir)] = judging
            return self._started[key]

    def _stop_servers(self) -> None:
        """Stop every served model's servers; charge a judge's hours to the runs it judged."""
        served, self._served = self._served, {}
        judged, self._judged = self._judged, {}
        for key, (model, stop) in served.items():
            seconds, replicas = stop()
            runs = list(judged.get(key, {}).values())
            assert model.serve is not None
            for store in runs:
                store.add_served(
                    ServedTime(
                        model=model.name,
                        engine=model.serve.engine,
                        replicas=replicas,
                        seconds=round(seconds * replicas / len(runs), 3),
                        price_per_replica_hour=model.serve.price_per_replica_hour,
                        role="judge",
                    )
                )

    def close(self) -> None:
        with self._lock:
            self._started.clear()
            try:
                self._stack.close()
            finally:
                self._stop_servers()

    def __enter__(self) -> ModelEndpoints:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()


def serve_here(model: ModelConfig) -> tuple[str, StopServers]:
    """A served model on this machine: one server (whatever `serve.replicas` says: the Ray
    engine places the replicas), started again at its address should it exit."""
    import socket

    from piserini_ray.serving import ServerProcess

    assert model.serve is not None
    server = ServerProcess(model.serve, model.name, socket.gethostname())
    base = server.start()
    threading.Thread(
        target=server.supervise, args=(_say,), name="serve-supervise", daemon=True
    ).start()

    def stop() -> tuple[float, int]:
        server.stop()
        return server.seconds_up(), 1

    return base, stop


def _say(message: str) -> None:
    print(f"[piserini-ray] {message}", file=sys.stderr, flush=True)
