"""Models served by the run on its own nodes (`model.serve`, issue 51): each engine's
command and health protocol (`presets.py`), one server as a child process that is started,
checked and stopped (`process.py`)."""

from piserini_ray.serving.presets import PRESETS, EnginePreset, litellm_route
from piserini_ray.serving.process import ServeError, ServerProcess, served_key

__all__ = ["PRESETS", "EnginePreset", "ServeError", "ServerProcess", "litellm_route", "served_key"]
