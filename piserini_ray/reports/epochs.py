"""The epochs report of a run repeated k times (`run.epochs`): `epochs.json` and `epochs.md`
in the run's directory, beside epoch 1's own report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel

from piserini_ray.metrics.epochs import EpochStats
from piserini_ray.records import Judgement
from piserini_ray.reports._format import percent
from piserini_ray.store.report_files import write_report_file


class EpochsReport(BaseModel):
    """Accuracy over a run's epochs (`run.epochs`): mean and sd, pass@k and pass^k; the run
    directory's `epochs.json`, and `Report.epochs`.

    Args:
        **fields: the report's fields (the pipeline makes it from each epoch's verdicts).

    Returns:
        A validated epochs report.

    Example:
        ```python
        from piserini_ray import load_config, report, run

        run_dir = run(load_config(overrides={"run.epochs": 2}), engine="local")
        print(report([run_dir]).epochs[0].stats)
        ```
    """

    run_dir: str
    model: str
    stats: EpochStats
    #: Each epoch's directory, epoch 1 first (the run directory itself).
    epoch_dirs: list[str]
    #: The `seed` request parameter each epoch's agent calls carried (None: none sent).
    seeds: list[int | None]


def epoch_outcomes(
    verdicts: Mapping[str, Judgement], recorded: Iterable[str]
) -> dict[str, bool | None]:
    """One epoch's outcome per recorded query: its verdict, or None when it has none yet or
    its judge failed (left out and listed by `epoch_stats`, never scored as wrong)."""
    out: dict[str, bool | None] = {}
    for query_id in recorded:
        verdict = verdicts.get(query_id)
        judged = verdict is not None and verdict.status == "judged"
        out[query_id] = bool(verdict.correct) if judged and verdict is not None else None
    return out


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{percent(value)} %"


def epochs_markdown(report: EpochsReport) -> str:
    s = report.stats
    k = s.epochs
    sd = f" ± {_pct(s.accuracy_sd)}" if s.accuracy_sd is not None else ""
    interval = (
        f" (95 % CI {_pct(s.accuracy_interval[0])}–{_pct(s.accuracy_interval[1])}, "
        "bootstrap over queries with all their epochs)"
        if s.accuracy_interval is not None
        else ""
    )
    lines = [
        f"## Epochs: {report.model}, {k} epochs of {s.queries} queries",
        "",
        f"Accuracy {_pct(s.accuracy_mean)}{sd} (mean ± sd over epochs){interval}."
        if s.queries
        else "Accuracy n/a: no query has a verdict in every epoch.",
        f"Consistency: {_pct(s.consistency)} of queries got the same verdict in every epoch.",
        "",
        "| epoch | accuracy | seed | directory |",
        "|---:|---:|---:|---|",
        *(
            f"| {e} | {_pct(a)} | {'none' if seed is None else seed} | `{d}` |"
            for e, (a, seed, d) in enumerate(
                zip(s.accuracy_per_epoch, report.seeds, report.epoch_dirs, strict=True), 1
            )
        ),
        "",
        "| k | pass@k (solved at least once) | pass^k (solved every time) |",
        "|---:|---:|---:|",
        *(f"| {j} | {_pct(s.pass_at[j])} | {_pct(s.pass_all[j])} |" for j in s.pass_at),
        "",
        "| epochs correct | queries |",
        "|---:|---:|",
        *(f"| {c} of {k} | {n} |" for c, n in s.correct_counts.items()),
    ]
    if s.incomplete:
        shown = ", ".join(s.incomplete[:10]) + (" ..." if len(s.incomplete) > 10 else "")
        lines += [
            "",
            f"{len(s.incomplete)} quer{'y' if len(s.incomplete) == 1 else 'ies'} without a "
            f"verdict in every epoch, left out: {shown} (`resume` runs what is missing)",
        ]
    return "\n".join(lines) + "\n"


def write_epochs_report(report: EpochsReport, run_dir: Path) -> None:
    write_report_file(run_dir / "epochs.json", report.model_dump_json(indent=2))
    write_report_file(run_dir / "epochs.md", epochs_markdown(report))
