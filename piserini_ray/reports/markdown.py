"""`summary.json` and a Table-1-style `report.md` for one or more runs."""

from __future__ import annotations

from collections.abc import Sequence

from piserini_ray.formats.imported import imported_lines
from piserini_ray.metrics.cost import cost_text
from piserini_ray.reports.agreement import agreement_markdown
from piserini_ray.reports.budget import budget_markdown
from piserini_ray.reports.decided import decision_text, decisions_markdown
from piserini_ray.reports.panel import panel_markdown
from piserini_ray.reports.run_metrics import Estimate, RunMetrics, ServedCost

#: The paper's BrowseComp-Plus results (docs/spec.md §9), shown beside ours and labelled as such.
PAPER_ROWS = [
    ("gpt-5.5 (paper)", "83.1", "94.7", "73.6", "58.9", "15.7", "$291.6"),
    ("gpt-5 (paper)", "74.6", "", "", "", "", "$94.9"),
    ("shallow BM25 baseline (paper)", "58.3", "", "", "", "", "$400.4"),
    ("qwen3-embed-8b baseline (paper)", "73.0", "", "", "", "", "$360.7"),
]


def _pct(e: Estimate | None) -> str:
    if e is None or e.value is None:
        return "n/a"
    ci = f" [{100 * e.ci95[0]:.1f}, {100 * e.ci95[1]:.1f}]" if e.ci95 else ""
    return f"{100 * e.value:.1f}{ci}"


def _bm25(m: RunMetrics) -> str:
    return f"BM25 k1={m.bm25['k1']:g} b={m.bm25['b']:g}"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _cost(m: RunMetrics) -> str:
    """The run's cost, with the part estimated for calls cut or failed after sending, and
    for a model the run serves, its servers' hours."""
    if m.cost_usd is None:
        return "n/a"
    text = cost_text(m.cost_usd, m.cost_estimated_usd, m.calls_usage_estimated)
    if m.served is not None:
        text += f" ({_served(m.served)})"
    return text


def _served(s: ServedCost) -> str:
    return (
        f"served by {s.engine}: {s.replica_hours:.4f} server-hours x "
        f"${s.price_per_replica_hour:g} = ${s.cost_usd:,.4f}; tokens free"
    )


def _judge_cost(m: RunMetrics) -> str:
    """The judge's cost, and for a judge the run serves, its servers' hours."""
    text = _num(m.judge_cost_usd, "${:,.4f}")
    return text + (f", {_served(m.judge_served)}" if m.judge_served is not None else "")


def _tokens(m: RunMetrics) -> str:
    if m.tokens_total is None or m.cached_token_ratio is None:
        return "Tokens: n/a (not in the imported format)"
    return (
        f"Tokens: {m.tokens_total.input_tokens:,} in ({m.tokens_total.cached_tokens:,} "
        f"cached, ratio {100 * m.cached_token_ratio:.1f} %), "
        f"{m.tokens_total.output_tokens:,} out; median per query "
        f"{_num(m.tokens_median_per_query, '{:,.0f}')}"
    )


def _judge_calibration(m: RunMetrics) -> str:
    """The judge's own confidence against agreement: a figure of ours, never a peer's."""
    head = "Judge calibration (the judge's confidence in its own verdict against agreement): "
    if m.judge_calibration:
        return head + ", ".join(f"{k} {_num(v)}" for k, v in m.judge_calibration.items()) + "."
    if m.judge_template == "browsecomp-plus":
        return head + "n/a (the browsecomp-plus template asks for the response's confidence)."
    return head + "n/a (no second judge or panel to agree with)."


def imported_markdown(m: RunMetrics) -> list[str]:
    """The line an imported run carries: where it came from and which figures its format
    cannot give (n/a in every table, never a 0 that would read as measured)."""
    if not m.imported_from:
        return []
    missing = ", ".join(m.unavailable) or "none"
    return [
        "",
        f"Imported from {' and '.join(m.imported_from)}: not in that format, shown n/a, never 0: "
        f"{missing}.",
        *(["", *imported_lines(m.imported_run)] if m.imported_run else []),
    ]


def backends_markdown(runs: Sequence[RunMetrics]) -> list[str]:
    """The runs' retrieval backends side by side, grouped by depth so that each group compares
    retrievers at matched depth (the sweep of `configs/sweep_backends.yaml`)."""
    lines = [
        "## Retrieval backends at matched depth",
        "",
        "Same agent, tools and budget; only the retriever differs within a depth. Recall is "
        "macro evidence recall, 95 % bootstrap intervals in brackets; the depth curves of all "
        "runs share one plot (depth.png).",
        "",
        "| depth | backend | retriever | model | accuracy % | surfaced % | previewed % | "
        "behavior % | cost |",
        "|---:|---|---|---|---|---|---|---|---:|",
    ]
    for m in sorted(runs, key=lambda m: (-m.depth, m.backend)):
        ev = {name: _pct(m.recall[name]["evidence"].macro) for name in m.recall}
        lines.append(
            f"| {m.depth} | {m.backend} | {m.retrieval} | {m.model} | {_pct(m.accuracy)} | "
            f"{ev['surfaced']} | {ev['previewed']} | {ev['behavior']} | "
            f"{_num(m.cost_usd, '${:,.2f}')} |"
        )
    return lines


def markdown_report(runs: Sequence[RunMetrics]) -> str:
    """The runs' markdown report: the table of every run, the paper's reference rows for
    BrowseComp-Plus, the backends and decisions when they differ, then a section per run."""
    lines = ["# piserini_ray report", "", *_runs_table(runs)]
    if any(m.benchmark.startswith("browsecomp-plus") for m in runs):
        lines += ["", *_paper_table()]
    if len({m.backend for m in runs}) > 1:
        lines += ["", *backends_markdown(runs)]
    decided = [(m.run_dir, m.decision) for m in runs if m.decision is not None]
    if len(runs) > 1 and decided:
        lines += ["", *decisions_markdown(decided)]
    for m in runs:
        lines += _run_section(m)
    return "\n".join(lines) + "\n"


def _runs_table(runs: Sequence[RunMetrics]) -> list[str]:
    """The runs side by side, a row each."""
    lines = [
        "| run | model | judge | queries | accuracy % [95% CI] | surfaced ev. recall % | "
        "previewed % | behavior % | CE (piserini) | CE (browsecomp-plus) | cost |",
        "|---|---|---|---:|---|---|---|---|---:|---:|---:|",
    ]
    for m in runs:
        evidence = {name: _pct(m.recall[name]["evidence"].macro) for name in m.recall}
        lines.append(
            f"| {m.run_dir} | {m.model} | {m.judge} | {m.queries} | {_pct(m.accuracy)}"
            f"{'' if m.accuracy_final else ' (not final)'} | "
            f"{evidence['surfaced']} | {evidence['previewed']} | {evidence['behavior']} | "
            f"{_num(m.calibration_error['piserini'])} | "
            f"{_num(m.calibration_error['browsecomp-plus'])} | {_num(m.cost_usd, '${:,.2f}')} |"
        )
    return lines


def _paper_table() -> list[str]:
    """The paper's reference rows (BrowseComp-Plus runs only): not measured here."""
    return [
        "Reference rows from the paper (BrowseComp-Plus, 830 queries, k1=25, b=1, "
        "depth 1000, T=300 s), not measured here:",
        "",
        "| reference | accuracy % | surfaced ev. % | previewed % | behavior % | CE | cost |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *("| " + " | ".join(row) + " |" for row in PAPER_ROWS),
    ]


def _run_section(m: RunMetrics) -> list[str]:
    """One run's section: its settings, accuracy and calibration, recall, depth curve, tools,
    tokens and cost, then its budget, panel and judges' agreement when it has them."""
    lines = [
        "",
        f"## {m.run_dir}",
        "",
        _settings_line(m),
        *imported_markdown(m),
        "",
        _accuracy_paragraph(m),
        "",
        "| set | evidence macro % | evidence micro % | gold macro % | gold micro % |",
        "|---|---|---|---|---|",
    ]
    for name, figures in m.recall.items():
        lines.append(
            f"| {name} | {_pct(figures['evidence'].macro)} | {_pct(figures['evidence'].micro)} "
            f"| {_pct(figures['gold'].macro)} | {_pct(figures['gold'].micro)} |"
        )
    lines += ["", _depth_line(m), "", _usage_line(m)]
    if m.calls_without_usage:
        lines += [
            "",
            f"**Warning: {m.calls_without_usage} calls reported no usage; cost is a lower "
            "bound** (their tokens are unknown and counted as 0).",
        ]
    if m.budget is not None:
        lines += ["", budget_markdown(m.budget, m.termination).rstrip("\n")]
    if m.panel is not None:
        lines += ["", panel_markdown(m.panel).rstrip("\n")]
    if m.judge_agreement:
        lines += ["", agreement_markdown(m.judge_agreement).rstrip("\n")]
    return lines


def _settings_line(m: RunMetrics) -> str:
    """The run's config, model, judge, retrieval and budget, and its queries by status."""
    return (
        f"Config {m.config_hash}, model {m.model}, judge {m.judge}, "
        + (
            f"{m.retrieval or _bm25(m)}, budget {m.budget_seconds:g} s, "
            if m.imported_run is None  # an imported run's settings are its files' (below)
            else "settings as its files state them (below), "
        )
        + f"{m.queries} queries: "
        + ", ".join(f"{k} {v}" for k, v in sorted(m.statuses.items()))
        + f"; judge failures {m.judge_failed}."
    )


def _accuracy_paragraph(m: RunMetrics) -> str:
    """Accuracy (final or not), over completed queries, and both calibration conventions."""
    return (
        f"Accuracy: {_pct(m.accuracy)} of all {m.queries} queries (timeouts and failures "
        "count as wrong)"
        + (
            ""
            if m.accuracy_final or m.accuracy_judged is None
            else f"; **not final**: {m.pending_verdicts} queries have no verdict yet (judge "
            f"failures are judged again by the next `judge`), {_pct(m.accuracy_judged)} of "
            f"the {m.accuracy_judged.queries} judged"
        )
        + f". Over completed queries: {_pct(m.accuracy_completed)} "
        f"({m.accuracy_completed.queries} queries). Calibration error: "
        f"piserini convention (default; the {m.calibration_queries} completed queries with "
        "a verdict, the agent's last stated confidence) "
        f"{_num(m.calibration_error['piserini'])}"
        + (
            " (Pi-Serini's own report prints it only from 100 queries)"
            if m.calibration_queries < 100
            else ""
        )
        + f", browsecomp-plus convention (the {m.calibration_queries_browsecomp_plus} "
        "answers the judge read, the agent's stated confidence as their grader extracts "
        f"it) {_num(m.calibration_error['browsecomp-plus'])}"
        + (" (undefined under 200 answers)" if m.calibration_queries_browsecomp_plus < 200 else "")
        + f". {_judge_calibration(m)}"
        + ("" if m.decision is None else f"\n\nStop when decided: {decision_text(m.decision)}.")
    )


def _depth_line(m: RunMetrics) -> str:
    """Surfaced recall at each depth, evidence then gold."""
    return (
        "Depth curve (surfaced recall, macro %): "
        + ", ".join(
            f"k={k}: {_num(None if v is None else 100 * v)}"
            for k, v in m.depth_curve["evidence"].items()
        )
        + " (evidence); "
        + ", ".join(
            f"k={k}: {_num(None if v is None else 100 * v)}"
            for k, v in m.depth_curve["gold"].items()
        )
        + " (gold)."
    )


def _usage_line(m: RunMetrics) -> str:
    """Tool calls per query, tokens, the run's and the judge's cost, where prices came from."""
    return (
        "Tool calls per query: "
        + ", ".join(f"{k} {v}" for k, v in m.tool_calls_per_query.items())
        + f". {_tokens(m)}. Cost {_cost(m)} "
        f"(+ judge {_judge_cost(m)}), prices from {m.pricing_source}."
    )
