"""One run pipeline for both engines: `prepare()` checks everything that can be checked before a
token is paid for, then opens the run stores and lists what is left to run; an engine (local or
Ray) runs the todo lists; `finish()` judges, reduces and writes the reports (`reports/`).

`prepare` goes in this order, so that a mistake never leaves a half-made run directory behind:
1. preflight of every run (pricing, API key variables, data files exist): a sweep is checked
   whole before any of it starts; then the engine starts (Ray and its replicas come up while
   the rest is checked), and one tiny request goes to each hosted model (`llm/check.py`);
2. the data: queries, qrels and the slice are loaded and checked, and the index is built or
   found (which reads, and so validates, the whole corpus: a torn line or a duplicate docid
   names its file and line);
3. qrels against the corpus and the queries: unusable qrels are an error, partly matching ones
   a warning with counts;
4. only then the run directory (created, locked, writable) and its todo list.

The engines sit below this module and never import it: they receive `PreparedRun`s and the
`Engine` protocol from `engines/contract.py`. Judging goes through the engine too
(`Engine.judge`), so a run is judged under the same limiters wherever it ran. The reports'
modules (matplotlib, SciPy) and the model check (litellm) load when used: a Ray engine starts
booting before they do.

Its parts, one private module per step: `_preparing` (steps 1-4 and the engine by name),
`_running` (an engine over the prepared runs, a sweep's decisions), `_finishing` (judging, the
reduce, the reports) and `_reading` (finished runs read back for the analyses).
"""

from __future__ import annotations

from piserini_ray.engines.contract import Engine, Log, PreparedRun, RunSummary
from piserini_ray.pipeline._finishing import finish, judge_run, reduce, report_epochs, report_runs
from piserini_ray.pipeline._preparing import (
    check_models,
    check_qrels,
    default_run_dir,
    ensure_dense_index,
    epoch_dir,
    index_for,
    make_engine,
    prepare,
    with_epochs,
)
from piserini_ray.pipeline._reading import compare, run_facts, run_figures
from piserini_ray.pipeline._running import (
    Decide,
    check_comparable,
    execute,
    run_and_report,
    run_local,
    run_on_ray,
    summarize,
)
from piserini_ray.reports.report import Report

__all__ = [
    "Decide",
    "Engine",
    "Log",
    "PreparedRun",
    "Report",
    "RunSummary",
    "check_comparable",
    "check_models",
    "check_qrels",
    "compare",
    "default_run_dir",
    "ensure_dense_index",
    "epoch_dir",
    "execute",
    "finish",
    "index_for",
    "judge_run",
    "make_engine",
    "prepare",
    "reduce",
    "report_epochs",
    "report_runs",
    "run_and_report",
    "run_facts",
    "run_figures",
    "run_local",
    "run_on_ray",
    "summarize",
    "with_epochs",
]
