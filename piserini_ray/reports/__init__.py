"""Reports of finished runs: pure functions of their metrics (no Ray, no model calls)."""

from __future__ import annotations

from pathlib import Path

from piserini_ray.reports.html import write_html_report
from piserini_ray.reports.markdown import markdown_report
from piserini_ray.reports.run_metrics import RunMetrics
from piserini_ray.store.report_files import write_report_file


def write_run_reports(metrics: RunMetrics, run_dir: Path, viewer: bool = False) -> None:
    """`summary.json`, `report.md`, the plots and `report.html` of one run; `viewer`: the page
    holds the trajectory viewer over the `viewer/` files already written."""
    write_report_file(run_dir / "summary.json", metrics.model_dump_json(indent=2))
    write_report_file(run_dir / "report.md", markdown_report([metrics]))
    write_html_report([metrics], run_dir, pareto=False, viewer=viewer)


__all__ = ["RunMetrics", "markdown_report", "write_html_report", "write_run_reports"]
