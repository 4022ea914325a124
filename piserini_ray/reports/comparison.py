"""Paired comparisons of runs over the queries they share: does run B beat run A on the same
questions? Accuracy, surfaced evidence recall and cost differences with paired bootstrap
intervals, the exact McNemar test, win / loss / tie counts, the queries that flipped, and the
power of the comparison (the smallest difference this many queries detect, and the queries a
difference needs); and the same power figures from one pilot run (`pilot_power`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel

from piserini_ray.metrics.cost import Price
from piserini_ray.metrics.intervals import paired_interval
from piserini_ray.metrics.paired import McNemar, mcnemar_exact
from piserini_ray.metrics.power import PowerFigures, independent_discordance, power_figures
from piserini_ray.reports._format import percent
from piserini_ray.reports.facts import QueryFacts

#: The accuracy differences (fractions) whose queries-needed `compare` and `power` print.
EFFECTS = (0.01, 0.02, 0.05)


class RunFacts(BaseModel):
    """One run's per-query facts under its primary judge, as a comparison needs them."""

    run_dir: str
    model: str
    judge: str
    facts: list[QueryFacts]
    price: Price | None  # the agent model's prices; None when unpriced


class PairedDifference(BaseModel):
    """`other - reference` over the pairs, with a 95 % paired bootstrap interval."""

    reference: float | None
    other: float | None
    difference: float | None
    ci95: tuple[float, float] | None
    queries: int


class Flip(BaseModel):
    query_id: str
    reference_correct: bool
    other_correct: bool


class PairedComparison(BaseModel):
    reference: str
    other: str
    reference_judge: str
    other_judge: str
    #: Queries with a record in both runs; everything below is over these.
    queries: int
    #: Queries of the pair without a verdict in either run (counted wrong, as in accuracy).
    unjudged: int
    accuracy: PairedDifference
    mcnemar: McNemar
    wins: int  # right in `other`, wrong in `reference`
    losses: int
    ties: int
    #: Macro surfaced evidence recall, over the shared queries that have evidence qrels.
    surfaced_recall: PairedDifference
    #: USD per query; None when either run is unpriced or a query of either run was imported
    #: from a format without usage (its tokens are unknown, not zero).
    cost_per_query: PairedDifference | None
    flips: list[Flip]
    #: Shared queries the reference cut short (timed out, or answered after the steer), and
    #: those of them the other run got right where the reference did not: does a longer budget
    #: rescue what the shorter one cut? None when the reference holds no budget clock (an
    #: imported format without timing or trajectory: whether it steered is unknown).
    cut_short: int | None = 0
    cut_short_gained: int | None = 0
    #: Figures of this comparison left n/a because a run's imported format lacks what they need
    #: (`records.UNAVAILABLE`) -> why; empty for runs of our own.
    unavailable: dict[str, str] = {}
    #: The power of this comparison at its observed discordance (exact McNemar, alpha 0.05,
    #: 80 %): the smallest detectable difference of this many queries, and the queries
    #: needed to detect EFFECTS.
    power: PowerFigures | None = None


def _correct(f: QueryFacts) -> bool:
    return f.verdict == "judged" and bool(f.correct)


def _difference(reference: Sequence[float], other: Sequence[float], seed: int) -> PairedDifference:
    def diff(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean(b) - np.mean(a))

    if not reference:
        return PairedDifference(reference=None, other=None, difference=None, ci95=None, queries=0)
    return PairedDifference(
        reference=float(np.mean(reference)),
        other=float(np.mean(other)),
        difference=diff(np.asarray(reference), np.asarray(other)),
        ci95=paired_interval(reference, other, diff, seed),
        queries=len(reference),
    )


#: The parts of a record (`records.UNAVAILABLE`) each figure of a comparison needs, and in
#: which run: "both", or "reference" (the cut-short counts read only the reference's steer).
NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "cost_per_query": (("usage",), "both"),
    "cut_short": (("timing", "trajectory"), "reference"),
}


def _lacking(runs: Sequence[tuple[str, RunFacts]], pairs: set[str]) -> dict[str, str]:
    """Each figure of `NEEDS` that a shared query of one of `runs` cannot give -> why: one
    such query is enough, as in `metrics.aggregate` (a figure over the others would pass for
    the runs')."""
    why: dict[str, str] = {}
    for figure, (parts, which) in NEEDS.items():
        for role, run in runs:
            if which != "both" and role != which:
                continue
            formats = sorted(
                {
                    f.imported[0] if f.imported else "imported"
                    for f in run.facts
                    if f.query_id in pairs and any(p in f.unavailable for p in parts)
                }
            )
            if formats:
                missing = " or ".join(parts)
                why.setdefault(
                    figure,
                    f"no {missing} in the {' and '.join(formats)} format of the {role} "
                    f"({run.run_dir})",
                )
    return why


def compare_runs(reference: RunFacts, other: RunFacts, seed: int = 0) -> PairedComparison:
    """`other` against `reference` over the queries both answered (in reference order)."""
    theirs = {f.query_id: f for f in other.facts}
    pairs = [(f, theirs[f.query_id]) for f in reference.facts if f.query_id in theirs]
    ref_right = [_correct(a) for a, _ in pairs]
    other_right = [_correct(b) for _, b in pairs]

    def per_query(pick: Callable[[QueryFacts], float | None]) -> tuple[list[float], list[float]]:
        kept = [(pick(a), pick(b)) for a, b in pairs]
        both = [(x, y) for x, y in kept if x is not None and y is not None]
        return [x for x, _ in both], [y for _, y in both]

    def surfaced(f: QueryFacts) -> float | None:
        cell = f.recall.get("surfaced", {}).get("evidence")
        return None if cell is None or cell[1] == 0 else cell[0] / cell[1]

    unavailable = _lacking(
        [("reference", reference), ("run", other)], {a.query_id for a, _ in pairs}
    )
    cost = None
    if (
        reference.price is not None
        and other.price is not None
        and "cost_per_query" not in unavailable
    ):
        ref_price, other_price = reference.price, other.price
        cost = _difference(
            [ref_price.cost(a.usage) for a, _ in pairs],
            [other_price.cost(b.usage) for _, b in pairs],
            seed,
        )
    wins = sum(1 for a, b in zip(ref_right, other_right, strict=True) if b and not a)
    cut = [(a, b) for a, b in pairs if a.status == "timeout" or a.steered]
    losses = sum(1 for a, b in zip(ref_right, other_right, strict=True) if a and not b)
    observed = (wins + losses) / len(pairs) if pairs else None
    return PairedComparison(
        reference=reference.run_dir,
        other=other.run_dir,
        reference_judge=reference.judge,
        other_judge=other.judge,
        queries=len(pairs),
        unjudged=sum(1 for a, b in pairs if a.verdict != "judged" or b.verdict != "judged"),
        accuracy=_difference([float(x) for x in ref_right], [float(y) for y in other_right], seed),
        mcnemar=mcnemar_exact(ref_right, other_right),
        wins=wins,
        losses=losses,
        ties=len(pairs) - wins - losses,
        surfaced_recall=_difference(*per_query(surfaced), seed),
        cost_per_query=cost,
        flips=[
            Flip(query_id=a.query_id, reference_correct=x, other_correct=y)
            for (a, _), x, y in zip(pairs, ref_right, other_right, strict=True)
            if x != y
        ],
        cut_short=None if "cut_short" in unavailable else len(cut),
        cut_short_gained=None
        if "cut_short" in unavailable
        else sum(1 for a, b in cut if _correct(b) and not _correct(a)),
        power=power_figures(len(pairs), observed, EFFECTS),
        unavailable=unavailable,
    )


def _points(d: PairedDifference | None, scale: float = 100.0, fmt: str = "{:+.1f}") -> str:
    if d is None or d.difference is None:
        return "n/a"
    text = fmt.format(scale * d.difference)
    if d.ci95 is not None:
        low, high = (fmt.format(scale * v) for v in d.ci95)
        text += f" [{low}, {high}]"
    return text


def paired_markdown(comparisons: Sequence[PairedComparison]) -> str:
    """The paired table (one row per run against the reference) and the flipped queries."""
    if not comparisons:
        return ""
    lines = [
        "## Paired comparison",
        "",
        f"Reference: {comparisons[0].reference}. Over the queries both runs answered; "
        "differences are run - reference with 95 % paired bootstrap intervals; McNemar is "
        "exact (two-sided); wins / losses count queries only the run / only the reference "
        "got right; cut short: the reference timed out or was steered, and of those, the ones "
        "only this run got right.",
        "",
        "| run | queries | accuracy % ref -> run | Δ accuracy pts [95% CI] | McNemar p | "
        "wins / losses / ties | Δ surfaced ev. recall pts [95% CI] | Δ cost $/query [95% CI] | "
        "cut short by ref -> right here |",
        "|---|---:|---|---|---:|---|---|---|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.other} | {c.queries} | {percent(c.accuracy.reference)} -> "
            f"{percent(c.accuracy.other)} | {_points(c.accuracy)} | {c.mcnemar.p_value:.4g} | "
            f"{c.wins} / {c.losses} / {c.ties} | {_points(c.surfaced_recall)} | "
            f"{_points(c.cost_per_query, 1.0, '{:+.4f}')} | "
            + ("n/a" if c.cut_short is None else f"{c.cut_short} -> {c.cut_short_gained}")
            + " |"
        )
    for c in comparisons:
        gained = [f.query_id for f in c.flips if f.other_correct]
        lost = [f.query_id for f in c.flips if not f.other_correct]
        lines.append("")
        lines.append(
            f"{c.other}: gains {len(gained)} ({', '.join(gained) or 'none'}), loses "
            f"{len(lost)} ({', '.join(lost) or 'none'})"
            + (
                f"; {c.unjudged} shared queries lack a verdict (counted wrong)"
                if c.unjudged
                else ""
            )
            + (
                f"; judged by {c.reference_judge} and {c.other_judge}: not the same judge"
                if c.reference_judge != c.other_judge
                else ""
            )
            + "".join(
                f"; {_FIGURE_NAMES.get(figure, figure)} n/a, never 0: {why}"
                for figure, why in c.unavailable.items()
            )
        )
    for c in comparisons:
        if c.power is not None:
            lines.append("")
            lines.append(f"{c.other}: {_power_sentence(c.power, 'observed')}")
    return "\n".join(lines) + "\n"


_FIGURE_NAMES = {"cost_per_query": "Δ cost", "cut_short": "cut short"}


def _count(n: int | None) -> str:
    return "out of reach" if n is None else f"{n:,}"


def _power_sentence(p: PowerFigures, how: str) -> str:
    """One line: the MDE of p.queries and the queries each effect needs."""
    head = f"power (exact McNemar, two-sided, α = {p.alpha:g}, {100 * p.power:.0f} % power): "
    if p.discordance is None or p.discordance == 0.0:
        return head + "the runs never disagree, so the discordance and the power are unknown"
    mde = p.minimum_detectable
    effects = " / ".join(f"{100 * e:g}" for e, _ in p.needed)
    counts = " / ".join(_count(n) for _, n in p.needed)
    return head + (
        f"at the {how} discordance {p.discordance:.3f}, {p.queries} queries detect a "
        + (
            f"difference of {100 * mde:.1f} points or more"
            if mde is not None
            else "no difference (out of reach at this size)"
        )
        + f"; to detect {effects} points: {counts} queries"
    )


class PilotPower(BaseModel):
    """Sizing a run from one pilot: its accuracy, the discordance assumed, and the figures."""

    run_dir: str
    judge: str
    queries: int
    accuracy: float | None
    #: How the discordance was obtained, in words (the assumption is stated in the output).
    assumption: str
    figures: PowerFigures


def pilot_power(
    run: RunFacts, effects: Sequence[float], discordance: float | None = None
) -> PilotPower:
    """The power figures of one pilot run: without `discordance`, two runs each right at the
    pilot's accuracy p, independently, disagree with probability 2 p (1 - p)."""
    n = len(run.facts)
    accuracy = sum(1 for f in run.facts if _correct(f)) / n if n else None
    if discordance is not None:
        psi: float | None = discordance
        assumption = f"discordance {discordance:.3f}, as given (--discordance)"
    elif accuracy in (0.0, 1.0):
        # 2p(1-p) = 0 would claim that no other run could ever disagree with this one.
        psi, assumption = (
            None,
            (
                f"the pilot's accuracy is {100 * (accuracy or 0.0):.0f} %, so it says nothing of "
                "how often another run would disagree with it: the discordance is unknown. Pass "
                "--discordance (the share of queries two runs disagree on, from a paired pilot) to "
                "size the run"
            ),
        )
    elif accuracy is not None:
        psi = independent_discordance(accuracy)
        assumption = (
            f"discordance assumed 2p(1-p) = {psi:.3f} at the pilot's accuracy p = "
            f"{accuracy:.3f}: two runs each right at p independently of each other (similar "
            "agents agree more often on the same queries, so this overstates the queries "
            "needed; pass --discordance from a paired pilot to sharpen it)"
        )
    else:
        psi, assumption = None, "no queries: the discordance is unknown"
    return PilotPower(
        run_dir=run.run_dir,
        judge=run.judge,
        queries=n,
        accuracy=accuracy,
        assumption=assumption,
        figures=power_figures(n, psi, effects),
    )


def power_markdown(p: PilotPower) -> str:
    """The pilot's accuracy, the assumption, and a table of effect -> queries needed."""
    f = p.figures
    mde = f.minimum_detectable
    unknown = f.discordance is None
    lines = [
        "## Power from a pilot run",
        "",
        f"Pilot: {p.run_dir} (judge {p.judge}): {p.queries} queries, accuracy "
        f"{percent(p.accuracy)}{'' if p.accuracy is None else ' %'} (unjudged counted wrong).",
        "",
        f"{p.assumption[0].upper()}{p.assumption[1:]}.",
        "",
        f"Exact McNemar test, two-sided, α = {f.alpha:g}, {100 * f.power:.0f} % power; an "
        "effect above the discordance is out of reach (one run would have to win every "
        "disagreement).",
        "",
        "| difference to detect (points) | queries needed |",
        "|---:|---:|",
        *(
            f"| {100 * e:g} | {'unknown (pass --discordance)' if unknown else _count(n)} |"
            for e, n in f.needed
        ),
        "",
        f"Smallest difference the pilot's {p.queries} queries detect: "
        + (
            "unknown without a discordance (pass --discordance)"
            if unknown
            else f"{100 * mde:.1f} points"
            if mde is not None
            else "out of reach at this size"
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"
