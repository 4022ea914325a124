"""`Report`: what the reports of one or several runs hold once written (what `judge` and
`report` return)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piserini_ray.reports.epochs import EpochsReport
    from piserini_ray.reports.run_metrics import RunMetrics


@dataclass
class Report:
    """What `report_runs` wrote (and what `judge` and `report` return): each run's metrics,
    the markdown table, and the combined report's files (several runs, or an `out` folder).

    Args:
        metrics: each run's `RunMetrics`, also in its `summary.json`.
        table: the runs side by side, in markdown.
        paired: the paired comparison against a sweep's reference run, in markdown.
        combined: the combined report's files (`report.md`, `report.html`).
        epochs: the epochs report of each run with several epochs.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import report

        result = report(["runs/a", "runs/b"])
        print(result.table, [m.accuracy.value for m in result.metrics])
        ```
    """

    metrics: list[RunMetrics]
    table: str
    paired: str | None = None
    combined: list[Path] = field(default_factory=list)
    #: The epochs report of each run with epochs (`report_epochs`).
    epochs: list[EpochsReport] = field(default_factory=list)
