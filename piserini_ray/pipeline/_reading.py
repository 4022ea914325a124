"""Reading finished runs back for the analyses: a run's facts and figures, paired comparisons
against a reference.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray.config import RunConfig
from piserini_ray.data import Benchmark, Query, load_benchmark
from piserini_ray.engines.contract import Log
from piserini_ray.metrics.cost import pricing_for
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.store import RunStore, manifest_config, read_served

if TYPE_CHECKING:
    from piserini_ray.reports.comparison import PairedComparison, RunFacts
    from piserini_ray.reports.decided import DecisionFigures
    from piserini_ray.reports.facts import QueryFacts
    from piserini_ray.reports.run_metrics import RunMetrics
    from piserini_ray.reports.viewer import ViewerWriter


def compare(
    reference: Path, others: Sequence[Path], log: Log, seed: int = 0
) -> list[PairedComparison]:
    """Paired comparisons of each run against `reference` over the queries they share, from
    each run's own judge's verdicts (nothing is called)."""
    from piserini_ray.reports.comparison import compare_runs

    base = run_facts(reference, log)
    return [compare_runs(base, run_facts(d, log), seed) for d in others]


def run_record_facts(
    store: RunStore,
    benchmark: Benchmark,
    wanted: dict[str, Query],
    judgements: dict[str, Judgement],
    viewer: ViewerWriter | None = None,
) -> list[QueryFacts]:
    """The map step, streaming the records one at a time, each with its rankings, in this
    process on either engine: shipping a run's records to Ray tasks costs more than the
    arithmetic (bench/reducers.py), and this way a run is never held whole in memory. With a
    `viewer`, each record (trajectory included) also becomes its query's viewer file."""
    streamed = store.iter_records(rankings=True, trajectory=viewer is not None)
    records: Iterator[QueryRecord] = (r for r in streamed if r.query_id in wanted)
    if viewer is not None:
        records = viewer.observe(records)
    from piserini_ray.reports.facts import facts_for

    return facts_for(records, benchmark, None, judgements)


def run_facts(run_dir: Path, log: Log) -> RunFacts:
    """A finished run's per-query facts under its primary judge, from its own manifest and
    what is judged already (nothing is called): the input of a paired comparison."""
    return _read_run(run_dir, log)[2]


def run_figures(run_dir: Path, log: Log) -> tuple[RunMetrics, RunFacts]:
    """A finished run's figures and per-query facts from what is judged already, written
    nowhere (nothing is called): the input of a leaderboard row."""
    from piserini_ray.reports.run_metrics import aggregate

    config, judgements, facts, in_slice = _read_run(run_dir, log)
    pricing = pricing_for(config)
    metrics = aggregate(
        config, Path(facts.run_dir), facts.facts, judgements, pricing, read_served(run_dir, log)
    )
    decision = decision_of(metrics, Path(facts.run_dir), in_slice, len(facts.facts))
    return metrics.model_copy(update={"decision": decision}), facts


def _read_run(run_dir: Path, log: Log) -> tuple[RunConfig, dict[str, Judgement], RunFacts, int]:
    """A finished run's config, verdicts and facts, and the size of its slice."""
    config = manifest_config(run_dir)
    benchmark = load_benchmark(config.benchmark)
    wanted = {q.query_id: q for q in benchmark.select(**config.slice.model_dump())}
    judge = config.judge_model().name
    if config.judge.models:
        from piserini_ray.reports.panel import panel_name

        judge = panel_name([m.name for m in config.judge.models])
    with RunStore(run_dir, config, log=log) as store:
        judgements = read_verdicts(config, store)[0]
        facts = run_record_facts(store, benchmark, wanted, judgements)
        directory = str(store.run_dir)
    price = pricing_for(config).model_price(config.model)
    from piserini_ray.reports.comparison import RunFacts

    return (
        config,
        judgements,
        RunFacts(run_dir=directory, model=config.model.name, judge=judge, facts=facts, price=price),
        len(wanted),
    )


def decision_of(
    metrics: RunMetrics, run_dir: Path, in_slice: int, run: int
) -> DecisionFigures | None:
    """The run's part in a `stop_when_decided` sweep, if it had one."""
    from piserini_ray.reports.decided import decision_figures

    accuracy = metrics.accuracy_judged or metrics.accuracy
    n = accuracy.queries
    correct = round((accuracy.value or 0.0) * n)
    return decision_figures(Path(run_dir), in_slice, run, (correct, n), metrics.cost_usd)


def read_verdicts(
    config: RunConfig, store: RunStore
) -> tuple[dict[str, Judgement], dict[str, dict[str, Judgement]]]:
    """The run's verdict on each judged query (its judge's, or its panel's majority), and
    every judge's verdicts by judge."""
    primary = config.judge_model().name
    names = [primary, *(m for m in store.judge_models() if m != primary)]
    verdicts = {name: store.judgements(name) for name in names}
    if not config.judge.models:
        return verdicts[primary], verdicts
    from piserini_ray.reports.panel import panel_verdicts

    panel = [m.name for m in config.judge.models]
    return panel_verdicts(verdicts, panel, config.judge.panel_ties), verdicts


def answered_records(store: RunStore, wanted: dict[str, Query]) -> list[QueryRecord]:
    return [r for r in store.iter_records(trajectory=False) if r.query_id in wanted]
