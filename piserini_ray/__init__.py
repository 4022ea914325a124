"""piserini_ray: distributed batch evaluation of agentic search over Lucene BM25.

The public API (everything in `__all__`; the rest of the package is internal):

- `load_config(path=None)`: a validated `RunConfig` (None: the embedded default);
- `run(config, run_dir=None, engine="ray")`: run (or resume) an evaluation, judge it and write
  its reports; returns the run directory;
- `run_sweep(path)`: run (or resume) every run of a sweep file together, then the combined
  report; `stop_when_decided` in the file stops each run once its comparison is decided;
- `judge(run_dirs)`: judge what is not judged yet, then report; returns a `Report`;
- `report(run_dirs, out=None)`: report runs side by side from their verdicts; a `Report`;
- `check_models(config)`: one tiny request to each model of a run, nothing run;
- `estimate(config)`: a seeded pilot of the slice and the whole slice's projected cost and
  makespan (a `PilotEstimate`);
- analyses of finished runs, nothing called: `compare(reference, others)` (a `PairedReport`),
  `leaderboard(run_dirs)` (a `LeaderboardReport`), `power(run_dir)` (a `PowerReport`);
  `read_records(run_dir)`: a run's `QueryRecord`s; `evidence_ranks(run_dir)`: where the
  evidence sat in its rankings;
- other harnesses' files: `export(run_dir, format, out)`, `import_runs(folder, format,
  config)` (an `ImportReport`); `pricing_check()`: the pricing table against litellm's map (a
  `PricingCheck`);
- retrieval without the agent: `build_index(config)` (a `BuiltIndex`), `build_dense_index`,
  `tool_session(config)` (the agent's tools, to call by hand), `tune_bm25(config)` (a
  `BM25Grid`), `backends_at_best(config, grid)`, `retrieval_eval(config)` (a
  `RetrievalEval`);
- `ask(config, query)`: one query in this process, its trajectory as it happens, recorded
  nowhere; `serve_offline(config)`: the offline models on 127.0.0.1;
- runs while they go: `run_status(path)`, `watch(path)` (a live web view),
  `request_stop(run_dir)` and `wait_until_stopped(run_dir)`;
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

# litellm fetches its price map from the internet at import unless told otherwise; these
# machines (and many clusters) have no route out, and a run must not depend on one.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Not `typing.TYPE_CHECKING`: importing typing would double this module's import time. Type
# checkers treat any constant of this name the same way (and check that these imports resolve).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from piserini_ray.api import (
        BM25Grid,
        BuiltIndex,
        ImportReport,
        LeaderboardReport,
        PairedReport,
        PilotEstimate,
        PowerReport,
        PricingCheck,
        RetrievalEval,
        ask,
        backends_at_best,
        build_dense_index,
        build_index,
        check_models,
        compare,
        estimate,
        evidence_ranks,
        export,
        import_runs,
        judge,
        leaderboard,
        load_config,
        power,
        pricing_check,
        read_records,
        report,
        request_stop,
        retrieval_eval,
        run,
        run_status,
        run_sweep,
        serve_offline,
        tool_session,
        tune_bm25,
        wait_until_stopped,
        watch,
    )
    from piserini_ray.config import RunConfig
    from piserini_ray.engines.contract import RunSummary
    from piserini_ray.errors import ConfigError, DataError, PiseriniRayError
    from piserini_ray.records import Judgement, QueryRecord, RunManifest
    from piserini_ray.reports.epochs import EpochsReport
    from piserini_ray.reports.report import Report
    from piserini_ray.reports.run_metrics import RunMetrics

#: Each public name and the module that defines it (loaded on first use).
_WHERE = {
    "load_config": "piserini_ray.api",
    "run": "piserini_ray.api",
    "run_sweep": "piserini_ray.api",
    "judge": "piserini_ray.api",
    "report": "piserini_ray.api",
    "check_models": "piserini_ray.api",
    "estimate": "piserini_ray.api",
    "compare": "piserini_ray.api",
    "leaderboard": "piserini_ray.api",
    "power": "piserini_ray.api",
    "read_records": "piserini_ray.api",
    "build_index": "piserini_ray.api",
    "build_dense_index": "piserini_ray.api",
    "tool_session": "piserini_ray.api",
    "tune_bm25": "piserini_ray.api",
    "backends_at_best": "piserini_ray.api",
    "retrieval_eval": "piserini_ray.api",
    "ask": "piserini_ray.api",
    "export": "piserini_ray.api",
    "import_runs": "piserini_ray.api",
    "evidence_ranks": "piserini_ray.api",
    "pricing_check": "piserini_ray.api",
    "serve_offline": "piserini_ray.api",
    "run_status": "piserini_ray.api",
    "watch": "piserini_ray.api",
    "request_stop": "piserini_ray.api",
    "wait_until_stopped": "piserini_ray.api",
    "ImportReport": "piserini_ray.api",
    "PricingCheck": "piserini_ray.api",
    "PilotEstimate": "piserini_ray.api",
    "PairedReport": "piserini_ray.api",
    "LeaderboardReport": "piserini_ray.api",
    "PowerReport": "piserini_ray.api",
    "BuiltIndex": "piserini_ray.api",
    "BM25Grid": "piserini_ray.api",
    "RetrievalEval": "piserini_ray.api",
    "RunConfig": "piserini_ray.config",
    "QueryRecord": "piserini_ray.records",
    "Judgement": "piserini_ray.records",
    "RunManifest": "piserini_ray.records",
    "RunSummary": "piserini_ray.engines.contract",
    "RunMetrics": "piserini_ray.reports.run_metrics",
    "Report": "piserini_ray.reports.report",
    "EpochsReport": "piserini_ray.reports.epochs",
    "PiseriniRayError": "piserini_ray.errors",
    "ConfigError": "piserini_ray.errors",
    "DataError": "piserini_ray.errors",
}

__all__ = [
    "BM25Grid",
    "BuiltIndex",
    "ConfigError",
    "DataError",
    "EpochsReport",
    "ImportReport",
    "Judgement",
    "LeaderboardReport",
    "PairedReport",
    "PilotEstimate",
    "PiseriniRayError",
    "PowerReport",
    "PricingCheck",
    "QueryRecord",
    "Report",
    "RetrievalEval",
    "RunConfig",
    "RunManifest",
    "RunMetrics",
    "RunSummary",
    "__version__",
    "ask",
    "backends_at_best",
    "build_dense_index",
    "build_index",
    "check_models",
    "compare",
    "estimate",
    "evidence_ranks",
    "export",
    "import_runs",
    "judge",
    "leaderboard",
    "load_config",
    "power",
    "pricing_check",
    "read_records",
    "report",
    "request_stop",
    "retrieval_eval",
    "run",
    "run_status",
    "run_sweep",
    "serve_offline",
    "tool_session",
    "tune_bm25",
    "wait_until_stopped",
    "watch",
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
