"""piserini_ray: distributed batch evaluation of agentic search over Lucene BM25.

The public API (everything in `__all__`; the rest of the package is internal):

- `load_config(path=None)`: a validated `RunConfig` (None: the embedded default);
- `run(config, run_dir=None, engine="ray")`: run (or resume) an evaluation, judge it and write
  its reports; returns the run directory;
- `run_sweep(path)`: run (or resume) every run of a sweep file together, then the combined
  report; `stop_when_decided` in the file stops each run once its comparison is decided;
- `judge(run_dirs)`: judge what is not judged yet, then report; returns a `Report`;
- `report(run_dirs, out=None)`: report runs side by side from their verdicts; a `Report`;
- the types a user reads back: `RunConfig`, `QueryRecord` (a line of `records.jsonl`),
  `Judgement` (a line of `judgements/<judge>.jsonl`), `RunManifest` (`manifest.json`),
  `RunSummary` (what a run prints before judging), `RunMetrics` (`summary.json`), `Report`,
  `EpochsReport` (`epochs.json`); the errors `PiseriniRayError`, `ConfigError`, `DataError`.

Example:
    ```python
    from piserini_ray import load_config, run

    run_dir = run(load_config(overrides={"slice.sample": 3}), engine="local")
    ```

Importing the package is cheap: each name loads its module when first used, so no Ray, JVM,
litellm or torch is imported before a run needs it.
"""

from __future__ import annotations

import os as _os
import sys as _sys
import types as _types

# litellm fetches its price map from the internet at import unless told otherwise; these
# machines (and many clusters) have no route out, and a run must not depend on one.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Not `typing.TYPE_CHECKING`: importing typing would double this module's import time. Type
# checkers treat any constant of this name the same way (and check that these imports resolve).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from piserini_ray.api import judge, load_config, report, run, run_sweep
    from piserini_ray.config import RunConfig
    from piserini_ray.engine_contract import RunSummary
    from piserini_ray.errors import ConfigError, DataError, PiseriniRayError
    from piserini_ray.pipeline import Report
    from piserini_ray.records import Judgement, QueryRecord, RunManifest
    from piserini_ray.report.epochs import EpochsReport
    from piserini_ray.report.run_metrics import RunMetrics

#: Each public name and the module that defines it (loaded on first use).
_WHERE = {
    "load_config": "piserini_ray.api",
    "run": "piserini_ray.api",
    "run_sweep": "piserini_ray.api",
    "judge": "piserini_ray.api",
    "report": "piserini_ray.api",
    "RunConfig": "piserini_ray.config",
    "QueryRecord": "piserini_ray.records",
    "Judgement": "piserini_ray.records",
    "RunManifest": "piserini_ray.records",
    "RunSummary": "piserini_ray.engine_contract",
    "RunMetrics": "piserini_ray.report.run_metrics",
    "Report": "piserini_ray.pipeline",
    "EpochsReport": "piserini_ray.report.epochs",
    "PiseriniRayError": "piserini_ray.errors",
    "ConfigError": "piserini_ray.errors",
    "DataError": "piserini_ray.errors",
}

__all__ = [
    "ConfigError",
    "DataError",
    "EpochsReport",
    "Judgement",
    "PiseriniRayError",
    "QueryRecord",
    "Report",
    "RunConfig",
    "RunManifest",
    "RunMetrics",
    "RunSummary",
    "__version__",
    "judge",
    "load_config",
    "report",
    "run",
    "run_sweep",
]


def __getattr__(name: str) -> object:
    """A public name's value, its module imported on first use (PEP 562)."""
    if name == "__version__":  # one owner: the package's metadata (pyproject.toml)
        from importlib.metadata import version

        value: object = version("piserini_ray")
    elif name in _WHERE:
        from importlib import import_module

        value = getattr(import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'piserini_ray' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(_types.ModuleType):
    """This package's module type: the function `report` keeps its name when the subpackage
    `piserini_ray.report` is imported (the import system would set the attribute to the
    subpackage, which stays in `sys.modules` and is reached as `from piserini_ray.report
    import ...`; `import piserini_ray.report as x` would give the function)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _WHERE and isinstance(value, _types.ModuleType):
            return  # a public name is never shadowed by a submodule of the same name
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
