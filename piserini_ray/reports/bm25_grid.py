"""Outputs of a BM25 grid: a table (CSV + markdown), a heatmap and the best config snippet."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from piserini_ray.analysis.bm25_grid import (
    OBJECTIVES,
    PYSERINI_DEFAULT,
    BackendScores,
    CellResult,
    best_cell,
)
from piserini_ray.reports._format import png
from piserini_ray.store.report_files import write_report_file


def write_grid_outputs(cells: Sequence[CellResult], objective: str, folder: Path) -> CellResult:
    best = best_cell(cells, objective)
    columns = sorted({m for c in cells for m in c.metrics})
    ordered = sorted(cells, key=lambda c: (c.k1, c.b))
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["k1", "b", "queries", *columns])
    for c in ordered:
        writer.writerow([c.k1, c.b, c.queries, *(c.metrics.get(m) for m in columns)])
    write_report_file(folder / "grid.csv", table.getvalue())
    shown = [o for o in OBJECTIVES]
    lines = [
        f"# BM25 grid ({len(cells)} cells, objective {objective})",
        "",
        f"Best: k1={best.k1:g}, b={best.b:g} ({objective} = {_pct(best.metrics[objective])}).",
        "",
        "| k1 | b | " + " | ".join(shown) + " |",
        "|---:|---:|" + "---:|" * len(shown),
    ]
    for c in ordered:
        mark = " ★" if c is best else (" ×" if (c.k1, c.b) == PYSERINI_DEFAULT else "")
        lines.append(
            f"| {c.k1:g}{mark} | {c.b:g} | "
            + " | ".join(_pct(c.metrics.get(o)) for o in shown)
            + " |"
        )
    write_report_file(folder / "grid.md", "\n".join(lines) + "\n")
    write_report_file(
        folder / "best.yaml",
        f"# best of the grid by {objective} = {_pct(best.metrics[objective])}\n"
        f"retrieval:\n  bm25: {{k1: {best.k1:g}, b: {best.b:g}}}\n",
    )
    _heatmap(cells, objective, best, folder / "heatmap.png")
    return best


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}"


def _heatmap(cells: Sequence[CellResult], objective: str, best: CellResult, path: Path) -> None:
    k1s = sorted({c.k1 for c in cells})
    bs = sorted({c.b for c in cells})
    value = {(c.k1, c.b): c.metrics.get(objective) for c in cells}
    grid = [[100 * (value.get((k1, b)) or 0.0) for k1 in k1s] for b in bs]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(k1s)), max(4, 0.4 * len(bs))))
    image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(k1s)), [f"{k:g}" for k in k1s], rotation=90)
    ax.set_yticks(range(len(bs)), [f"{b:g}" for b in bs])
    ax.set_xlabel("k1")
    ax.set_ylabel("b")
    fig.colorbar(image, ax=ax, label=f"{objective} (%)")
    if PYSERINI_DEFAULT in value:
        ax.text(
            k1s.index(PYSERINI_DEFAULT[0]),
            bs.index(PYSERINI_DEFAULT[1]),
            "×",
            ha="center",
            va="center",
            color="white",
            fontsize=14,
        )
    ax.text(
        k1s.index(best.k1),
        bs.index(best.b),
        "★",
        ha="center",
        va="center",
        color="red",
        fontsize=14,
    )
    ax.set_title(f"BM25 grid: {objective} (× pyserini default, ★ best)")
    fig.tight_layout()
    write_report_file(path, png(fig), binary=True)
    plt.close(fig)


def backends_table(results: Sequence[BackendScores]) -> list[str]:
    """Backends side by side (columns), one metric a row, in percent."""
    metrics = list(results[0].metrics)
    width = max(len(m) for m in metrics)
    lines = [f"  {'':{width}}  " + "  ".join(f"{r.backend:>8}" for r in results)]
    for name in metrics:
        cells = [r.metrics[name] for r in results]
        lines.append(
            f"  {name:{width}}  "
            + "  ".join("     n/a" if v is None else f"{100 * v:7.2f}%" for v in cells)
        )
    return lines
