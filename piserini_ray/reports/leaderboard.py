"""A leaderboard of runs of one benchmark (ours and imported): accuracy with its interval, both
calibration conventions, the recalls, cost and n per run, and for each row whether it differs
from the top row beyond chance: the exact McNemar test over the queries both answered, its
p-values Holm-corrected across the rows, with the minimum detectable difference of that
comparison (the accuracy difference it detects with 80 % power at its observed discordance).
Rows whose query set differs from the top row's say so: their comparison is over the shared
queries only, while their own figures are over all of theirs."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from piserini_ray.metrics.paired import holm
from piserini_ray.metrics.power import ALPHA
from piserini_ray.reports.comparison import RunFacts, compare_runs
from piserini_ray.reports.decided import decision_text
from piserini_ray.reports.run_metrics import Estimate, RunMetrics
from piserini_ray.store.report_files import write_report_file

#: The recall columns: macro evidence recall of these document sets.
RECALLS = ("surfaced", "previewed", "behavior")


class LeaderboardRow(BaseModel):
    rank: int
    run_dir: str
    model: str
    judge: str
    queries: int
    accuracy: Estimate
    #: CE x 100 by convention (`piserini`, `browsecomp-plus`); None where undefined.
    calibration: dict[str, float | None]
    #: Macro evidence recall by document set (`RECALLS`).
    recall: dict[str, Estimate]
    cost_usd: float | None
    #: Against the top row (all None on the top row): queries both answered, accuracy
    #: difference (this row - top) over them, the exact McNemar p, Holm-adjusted across rows.
    shared_queries: int | None = None
    difference: float | None = None
    p_value: float | None = None
    p_holm: float | None = None
    #: True when the Holm-adjusted p is at most alpha: a difference beyond chance.
    differs: bool | None = None
    #: The smallest accuracy difference this comparison detects (80 % power, exact McNemar, at
    #: its observed discordance); None when the runs never disagree or none is in reach.
    minimum_detectable: float | None = None
    #: The share of shared queries the two runs disagree on (what the MDE is computed at).
    discordance: float | None = None
    #: Whether the query set equals the top row's; what differs, in words, when not.
    same_queries: bool = True
    notes: list[str] = []


class Leaderboard(BaseModel):
    benchmark: str
    alpha: float = ALPHA
    rows: list[LeaderboardRow]


def _accuracy_key(m: RunMetrics) -> float:
    return -1.0 if m.accuracy.value is None else m.accuracy.value


def leaderboard(runs: Sequence[tuple[RunMetrics, RunFacts]], seed: int = 0) -> Leaderboard:
    """Rank the runs by accuracy (the first given wins a tie) and compare each with the top."""
    if not runs:
        raise ValueError("a leaderboard needs at least one run")
    benchmarks = sorted({m.benchmark for m, _ in runs})
    if len(benchmarks) > 1:
        named = ", ".join(f"{m.run_dir} ({m.benchmark})" for m, _ in runs)
        raise ValueError(
            f"a leaderboard compares runs of one benchmark; these are of {benchmarks}: {named}"
        )
    ranked = sorted(runs, key=lambda run: -_accuracy_key(run[0]))
    top_metrics, top = ranked[0]
    top_ids = {f.query_id for f in top.facts}
    rows = [_row(1, top_metrics)]
    for rank, (m, facts) in enumerate(ranked[1:], 2):
        c = compare_runs(top, facts, seed)
        ids = {f.query_id for f in facts.facts}
        notes = []
        if ids != top_ids:
            notes.append(
                f"query set differs from the top row's: {len(ids & top_ids)} shared, "
                f"{len(ids - top_ids)} only here, {len(top_ids - ids)} only in the top row "
                "(the test is over the shared ones)"
            )
        if facts.judge != top.judge:
            notes.append(f"judged by {facts.judge}, the top row by {top.judge}")
        if m.decision is not None and m.decision.role == "compared":
            notes.append(decision_text(m.decision))
        rows.append(
            _row(rank, m).model_copy(
                update={
                    "shared_queries": c.queries,
                    "difference": c.accuracy.difference,
                    "p_value": c.mcnemar.p_value if c.queries else None,
                    "minimum_detectable": c.power.minimum_detectable if c.power else None,
                    "discordance": c.power.discordance if c.power else None,
                    "same_queries": ids == top_ids,
                    "notes": notes,
                }
            )
        )
    tested = [r for r in rows[1:] if r.p_value is not None]
    for row, adjusted in zip(tested, holm([r.p_value or 0.0 for r in tested]), strict=True):
        row.p_holm = adjusted
        row.differs = adjusted <= ALPHA
    return Leaderboard(benchmark=benchmarks[0], rows=rows)


def _row(rank: int, m: RunMetrics) -> LeaderboardRow:
    return LeaderboardRow(
        rank=rank,
        run_dir=m.run_dir,
        model=m.model,
        judge=m.judge,
        queries=m.queries,
        accuracy=m.accuracy,
        calibration=dict(m.calibration_error),
        recall={name: m.recall[name]["evidence"].macro for name in RECALLS},
        cost_usd=m.cost_usd,
    )


def _pct(e: Estimate) -> str:
    if e.value is None:
        return "n/a"
    ci = f" [{100 * e.ci95[0]:.1f}, {100 * e.ci95[1]:.1f}]" if e.ci95 else ""
    return f"{100 * e.value:.1f}{ci}"


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def _mde(r: LeaderboardRow) -> str:
    if r.rank == 1:
        return ""
    if r.minimum_detectable is not None:
        return f"{100 * r.minimum_detectable:.1f}"
    if r.discordance:  # the runs disagree too rarely for any difference to reach 80 % power
        return "out of reach"
    return "n/a (the runs never disagree)"


def _verdict(r: LeaderboardRow) -> str:
    if r.rank == 1:
        return "top"
    if r.differs is None:
        return "n/a (no shared query)"
    return "yes" if r.differs else "no"


HEADER = (
    "rank",
    "run",
    "model",
    "n",
    "accuracy % [95% CI]",
    "CE (piserini)",
    "CE (browsecomp-plus)",
    *(f"{name} ev. recall %" for name in RECALLS),
    "cost",
    "Δ vs top (pts)",
    "McNemar p",
    "Holm p",
    "differs beyond chance",
    "min. detectable (pts)",
    "notes",
)


def leaderboard_cells(board: Leaderboard) -> list[list[str]]:
    """One list of cells per row, in `HEADER` order (markdown and HTML share them)."""
    return [
        [
            str(r.rank),
            r.run_dir,
            r.model,
            str(r.queries),
            _pct(r.accuracy),
            _num(r.calibration.get("piserini"), "{:.1f}"),
            _num(r.calibration.get("browsecomp-plus"), "{:.1f}"),
            *(_pct(r.recall[name]) for name in RECALLS),
            _num(r.cost_usd, "${:,.2f}"),
            _num(None if r.difference is None else 100 * r.difference, "{:+.1f}"),
            _num(r.p_value, "{:.4g}"),
            _num(r.p_holm, "{:.4g}"),
            _verdict(r),
            _mde(r),
            "; ".join(r.notes),
        ]
        for r in board.rows
    ]


def _caption(board: Leaderboard) -> str:
    return (
        f"Runs of {board.benchmark}, ranked by accuracy. Each row against the top row: exact "
        "two-sided McNemar test over the queries both answered (unjudged answers count wrong, "
        f"as in accuracy), p-values Holm-corrected across the {max(0, len(board.rows) - 1)} "
        f"comparisons; a row differs beyond chance when its Holm p is at most {board.alpha:g}. "
        "Min. detectable: the accuracy difference that comparison detects with 80 % power at "
        "its observed discordance. CE: calibration error x 100 in each named convention "
        "(piserini: the completed queries, every bin; browsecomp-plus: theirs, the agent's "
        "stated confidence over the answers the judge read, the last bin dropped, undefined "
        "under 200). Recall: macro evidence recall with 95 % bootstrap intervals."
    )


def leaderboard_markdown(board: Leaderboard) -> str:
    lines = [
        "# Leaderboard",
        "",
        _caption(board),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" for _ in HEADER) + "|",
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in
              leaderboard_cells(board)]  # fmt: skip
    return "\n".join(lines) + "\n"


def leaderboard_html(board: Leaderboard) -> str:
    """A static page: the same cells, a row that differs beyond chance marked."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join(
        f'<tr data-differs="{_verdict(r)}">'
        + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        + "</tr>"
        for r, cells in zip(board.rows, leaderboard_cells(board), strict=True)
    )
    title = f"Leaderboard: {html.escape(board.benchmark)}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px}}tr[data-differs="yes"]{{background:#fee}}</style>
</head><body><h1>Leaderboard</h1><p>{html.escape(_caption(board))}</p>
<table><tr>{head}</tr>{body}</table></body></html>
"""


def write_leaderboard(board: Leaderboard, folder: Path) -> list[Path]:
    """`leaderboard.md`, `leaderboard.html` and `leaderboard.json` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"leaderboard.{ext}" for ext in ("md", "html", "json")]
    write_report_file(paths[0], leaderboard_markdown(board))
    write_report_file(paths[1], leaderboard_html(board))
    write_report_file(paths[2], board.model_dump_json(indent=2))
    return paths
