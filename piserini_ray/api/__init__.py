"""The public API: load a run config, run it, judge, report and analyse runs, tune and
evaluate retrieval, ask one query, watch and stop runs, from Python.

These functions do what the commands of the same name do (`piserini-ray run`, `judge`,
`report`, `compare`, `tune-bm25`, ...): the command line is a client of this module and
reaches the engines, the pipeline and the reports only through it. `piserini_ray/__init__.py`
exports them lazily, so `import piserini_ray` stays cheap; this module loads Ray, the JVM,
litellm and the reports' libraries only when a call needs them (what the results hold is
typed here, for the type checker only).
"""

from __future__ import annotations

from piserini_ray.api._analysis import (
    LeaderboardReport,
    PairedReport,
    PowerReport,
    compare,
    evidence_ranks,
    leaderboard,
    power,
    read_records,
)
from piserini_ray.api._formats import (
    ImportReport,
    PricingCheck,
    export,
    import_runs,
    pricing_check,
    serve_offline,
)
from piserini_ray.api._live import (
    request_stop,
    run_status,
    wait_until_stopped,
    watch,
)
from piserini_ray.api._retrieval import (
    BM25Grid,
    BuiltIndex,
    RetrievalEval,
    ask,
    backends_at_best,
    build_dense_index,
    build_index,
    retrieval_eval,
    tool_session,
    tune_bm25,
)
from piserini_ray.api._runs import (
    PilotEstimate,
    check_models,
    estimate,
    judge,
    load_config,
    report,
    run,
    run_sweep,
)

__all__ = [
    "BM25Grid",
    "BuiltIndex",
    "ImportReport",
    "LeaderboardReport",
    "PairedReport",
    "PilotEstimate",
    "PowerReport",
    "PricingCheck",
    "RetrievalEval",
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
