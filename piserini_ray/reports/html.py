"""A static `report.html` that opens from disk: the summary table and the PNG plots beside it."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path

from piserini_ray.reports.markdown import markdown_report
from piserini_ray.reports.plots import (
    plot_accuracy_budget,
    plot_answer_times,
    plot_depth,
    plot_pareto,
    plot_tools,
)
from piserini_ray.reports.run_metrics import RunMetrics
from piserini_ray.reports.viewer import VIEWER_HTML
from piserini_ray.store.report_files import write_report_file

# After load, the page records how many plots rendered (tests read it with headless Chromium).
_CHECK = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  document.body.dataset.imagesLoaded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.imagesTotal = imgs.length;
});
</script>"""


def _markdown_to_html(text: str) -> str:
    """Our own markdown (headings, pipe tables, paragraphs) to HTML, escaping everything."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if table:
            head, *body = table
            rows = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                for row in body
            )
            out.append(
                "<table><tr>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in head)
                + f"</tr>{rows}</table>"
            )
            table.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                table.append(cells)
            continue
        flush()
        heading = re.match(r"(#{1,4}) (.*)", line)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{html.escape(heading.group(2))}</h{level}>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)


def write_html_report(
    runs: Sequence[RunMetrics], folder: Path, pareto: bool, viewer: bool = False
) -> Path:
    """Plots and `report.html` in `folder`; the Pareto plot when comparing runs (a sweep);
    `viewer`: the trajectory viewer of one run (`reports/viewer.py`)."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_depth(runs, folder / "depth.png"),
        plot_tools(runs, folder / "tools.png"),
        plot_answer_times(runs, folder / "answer_times.png"),
    ]
    if pareto:
        plots.insert(0, plot_pareto(runs, folder / "pareto.png"))
        plots.append(plot_accuracy_budget(runs, folder / "accuracy_budget.png"))
    images = "\n".join(
        f'<figure><img src="{p.name}" alt="{p.stem}" width="640"><figcaption>{p.stem}'
        "</figcaption></figure>"
        for p in plots
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>piserini_ray report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px}}
figure{{display:inline-block;margin:1em}}th[data-key]{{cursor:pointer;background:#f4f4f4}}
#query-table tbody tr{{cursor:pointer}}#query-table tbody tr:hover{{background:#eef}}
.turn{{border-left:3px solid #99c;margin:.6em 0;padding-left:.6em}}.steer{{color:#b00}}
pre{{white-space:pre-wrap;background:#f8f8f8;padding:4px;max-height:30em;overflow:auto}}
dt{{font-weight:bold}}</style>
{_CHECK}</head><body>
{_markdown_to_html(markdown_report(runs))}
<h2>Plots</h2>
{images}
{VIEWER_HTML if viewer else ""}
</body></html>
"""
    return write_report_file(folder / "report.html", page)
