"""Judging, metrics and reports of finished runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from piserini_ray.config import RunConfig
from piserini_ray.data import load_benchmark
from piserini_ray.metrics.cost import pricing_for
from piserini_ray.report.html import write_html_report
from piserini_ray.report.markdown import markdown_report
from piserini_ray.report.metrics import RunMetrics, aggregate, facts_for
from piserini_ray.store import RunStore


def judge_and_report(
    config: RunConfig,
    run_dir: Path,
    log: Callable[[str], None],
    judge: bool = True,
    on_ray: bool = False,
) -> RunMetrics:
    """Judge what is not judged yet (unless `judge` is False), then write `summary.json`,
    `report.md`, the plots and `report.html` into the run directory; return the metrics.
    `on_ray`: judge tasks and the metrics' map step run on the (already started) Ray cluster."""
    from piserini_ray.judge import judge_records
    from piserini_ray.local_run import endpoint_for

    if on_ray:
        from piserini_ray.runtime import ensure_ray

        ensure_ray(config, log)

    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    with RunStore(run_dir, config, log=log) as store:
        records = [r for r in store.records() if r.query_id in wanted]
        judge_model = config.judge_model()
        if judge:
            with endpoint_for(judge_model, config) as api_base:
                if on_ray:
                    from piserini_ray.runtime.reporting import judge_on_ray

                    judgements = judge_on_ray(config, store, records, wanted, api_base, log)
                else:
                    judgements = asyncio.run(
                        judge_records(config, store, records, wanted, api_base, log)
                    )
        else:
            judgements = store.judgements(judge_model.name)
        if on_ray:
            from piserini_ray.runtime.reporting import facts_on_ray

            facts = facts_on_ray(config, records, store.rankings(), judgements)
        else:
            facts = facts_for(records, benchmark, store.rankings(), judgements)
        metrics = aggregate(config, store.run_dir, facts, judgements, pricing_for(config))
    (Path(run_dir) / "summary.json").write_text(metrics.model_dump_json(indent=2))
    (Path(run_dir) / "report.md").write_text(markdown_report([metrics]))
    write_html_report([metrics], Path(run_dir), pareto=False)
    return metrics


__all__ = ["RunMetrics", "judge_and_report", "markdown_report", "write_html_report"]
