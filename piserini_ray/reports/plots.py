"""PNG plots of run metrics (matplotlib, headless): accuracy vs cost with the Pareto frontier,
the depth curve, tool calls by tool, when queries are answered against the budget, and accuracy
against the budget across runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on a cluster node or in CI
import matplotlib.pyplot as plt

from piserini_ray.reports._format import png
from piserini_ray.reports.run_metrics import RunMetrics
from piserini_ray.store.report_files import write_report_file


def _policy(m: RunMetrics) -> str:
    if m.termination.startswith("iterations"):
        return m.termination.split(": ", 1)[1].replace(" model turns", " turns")
    return f"T={m.budget_seconds:g}s" + (" or turns" if m.termination.startswith("both") else "")


def _label(m: RunMetrics) -> str:
    if m.backend == "bm25":
        return f"{m.model}, {_policy(m)}, k1={m.bm25['k1']:g} b={m.bm25['b']:g}"
    return f"{m.model}, {_policy(m)}, {m.backend} @ {m.depth}"


def _finish(fig: plt.Figure, ax: plt.Axes, path: Path, title: str, legend: dict | None) -> Path:
    ax.set_title(title)
    # Only what was drawn has a legend (a run without the figure, e.g. an imported one, draws
    # nothing: an empty legend would only warn).
    if legend is not None and ax.get_legend_handles_labels()[0]:
        ax.legend(**legend)
    fig.tight_layout()
    write_report_file(path, png(fig), binary=True)
    plt.close(fig)
    return path


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both cost (lower) and accuracy (higher)."""
    front = []
    for i, (cost, acc) in enumerate(points):
        dominated = any(
            (c <= cost and a >= acc) and (c < cost or a > acc)
            for j, (c, a) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def plot_pareto(runs: Sequence[RunMetrics], path: Path) -> Path:
    priced = [m for m in runs if m.cost_usd is not None and m.accuracy.value is not None]
    points = [(m.cost_usd or 0.0, 100 * (m.accuracy.value or 0.0)) for m in priced]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, (cost, acc) in zip(priced, points, strict=True):
        ax.scatter(cost, acc, s=40)
        ax.annotate(_label(m), (cost, acc), fontsize=7, xytext=(4, 4), textcoords="offset points")
    front = pareto_front(points)
    if front:
        ax.plot(
            [points[i][0] for i in front],
            [points[i][1] for i in front],
            "k--",
            lw=1,
            label="Pareto frontier",
        )
        ax.legend(loc="lower right")
    ax.set_xlabel("cost (USD)")
    ax.set_ylabel(f"accuracy (%, judge: {runs[0].judge if runs else ''})")
    ax.set_title("Accuracy vs cost")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    write_report_file(path, png(fig), binary=True)
    plt.close(fig)
    return path


def _not_drawn(ax: plt.Axes, runs: Sequence[str]) -> None:
    """Name on the plot the runs it leaves out because their format lacks its figure (n/a,
    never a curve at 0): mid-plot when nothing was drawn, else at its foot."""
    if not runs:
        return
    empty = not ax.get_legend_handles_labels()[0]
    ax.text(
        0.5,
        0.5 if empty else 0.02,
        "n/a (not in the imported format): " + "; ".join(runs),
        transform=ax.transAxes,
        ha="center",
        va="center" if empty else "bottom",
        fontsize=7,
        wrap=True,
    )


def plot_depth(runs: Sequence[RunMetrics], path: Path) -> Path:
    """Macro surfaced recall by retrieval depth, a curve per run and qrels kind; a run whose
    rankings are not recorded (an imported one: all None) draws no curve and is named."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    left_out = []
    for m in runs:
        drawn = False
        for kind, style in (("evidence", "-o"), ("gold", "--s")):
            curve = {k: v for k, v in m.depth_curve[kind].items() if v is not None}
            if curve:
                drawn = True
                ax.plot(
                    list(curve),
                    [100 * v for v in curve.values()],
                    style,
                    ms=3,
                    label=f"{kind}: {_label(m)}",
                )
        if not drawn and "depth_curve" in m.unavailable:
            left_out.append(_label(m))
    _not_drawn(ax, left_out)
    ax.set_xscale("log")
    ax.set_xlabel("retrieval depth k")
    ax.set_ylabel("surfaced recall (macro, %)")
    ax.grid(alpha=0.3, which="both")
    return _finish(fig, ax, path, "Depth curve", {"fontsize": 7})


def plot_tools(runs: Sequence[RunMetrics], path: Path) -> Path:
    tools = sorted({t for m in runs for t in m.tool_calls_per_query if t != "total"})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(1, len(runs))
    for i, m in enumerate(runs):
        xs = [j + i * width for j in range(len(tools))]
        ax.bar(xs, [m.tool_calls_per_query.get(t, 0) for t in tools], width, label=_label(m))
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(tools))], tools)
    ax.set_ylabel("calls per query")
    return _finish(fig, ax, path, "Tool calls by tool", {"fontsize": 7})


def plot_answer_times(runs: Sequence[RunMetrics], path: Path) -> Path:
    """Share of all queries answered by each charged second, a line per run, the steer and the
    budget marked: a curve still rising at the budget means the budget cut queries short."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in runs:
        if m.budget is None or not m.budget.queries:
            continue
        times = m.budget.answer_times
        shares = [100 * (i + 1) / m.budget.queries for i in range(len(times))]
        (line,) = ax.step([0.0, *times], [0.0, *shares], where="post", label=_label(m))
        if not m.termination.startswith("iterations"):
            ax.axvline(m.budget_seconds, color=line.get_color(), ls=":", lw=1)
    _not_drawn(ax, [_label(m) for m in runs if "budget" in m.unavailable])
    ax.set_xlabel("charged seconds (dotted: each run's budget)")
    ax.set_ylabel("queries answered (% of all)")
    ax.grid(alpha=0.3)
    return _finish(fig, ax, path, "When queries are answered", {"fontsize": 7})


def plot_accuracy_budget(runs: Sequence[RunMetrics], path: Path) -> Path:
    """Accuracy against the time budget (runs with a clock), turn-capped runs as lines."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    timed = sorted(
        (m for m in runs if not m.termination.startswith("iterations")),
        key=lambda m: (m.model, m.budget_seconds),
    )
    for model in dict.fromkeys(m.model for m in timed):
        mine = [m for m in timed if m.model == model]
        ax.plot(
            [m.budget_seconds for m in mine],
            [100 * (m.accuracy.value or 0.0) for m in mine],
            "-o",
            label=model,
        )
    for m in runs:
        if m.termination.startswith("iterations"):
            ax.axhline(100 * (m.accuracy.value or 0.0), ls="--", lw=1, label=_label(m))
    if timed:
        ax.set_xscale("log")
    ax.set_xlabel("time budget T (s)")
    ax.set_ylabel(f"accuracy (%, judge: {runs[0].judge if runs else ''})")
    ax.grid(alpha=0.3, which="both")
    return _finish(fig, ax, path, "Accuracy vs budget", {"fontsize": 7})
