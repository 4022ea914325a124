"""How far one judge can be trusted: a second (third, ...) judge's verdicts on the same answers,
per pair of judges raw agreement, Cohen's kappa with a bootstrap interval, accuracy under each,
and the queries they disagree on (seed §6.5: the paper never checks its judge)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from piserini_ray.data import Query
from piserini_ray.metrics.calibration import calibration_error
from piserini_ray.metrics.intervals import paired_interval
from piserini_ray.metrics.paired import cohens_kappa
from piserini_ray.records import Judgement
from piserini_ray.reports._format import percent

#: Disagreements listed in report.md per pair (summary.json keeps them all).
SHOWN_DISAGREEMENTS = 50


class Disagreement(BaseModel):
    query_id: str
    question: str
    answer: str | None  # the agent's exact answer
    gold: str
    #: judge -> correct
    verdicts: dict[str, bool]


class JudgeAgreement(BaseModel):
    first: str
    second: str
    #: Queries both judges gave a verdict on: every figure below is over these.
    queries: int
    raw_agreement: float | None
    kappa: float | None
    kappa_ci95: tuple[float, float] | None
    #: judge -> accuracy over the shared queries
    accuracy: dict[str, float | None]
    disagreements: list[Disagreement]
    #: Judge calibration (no peer's convention): judge -> CE x 100 of its confidence in its own
    #: verdict against agreeing with the other judge, over `calibration_queries`: the shared
    #: answers both read under our template (`reads_own_confidence`).
    calibration: dict[str, float | None] = {}
    calibration_queries: int = 0


def reads_own_confidence(verdict: Judgement) -> bool:
    """A verdict whose `confidence` is the judge's own in an answer it read: a call was made
    (a verdict by rule, on no response, makes none) under our template (theirs asks for the
    response's confidence instead)."""
    return (
        verdict.status == "judged"
        and verdict.attempts > 0
        and verdict.template == "piserini"
        and verdict.confidence is not None
    )


def own_calibration(judge: Sequence[Judgement], agrees: Sequence[bool]) -> float | None:
    """CE x 100 of a judge's own confidences against whether it agreed (RMS, consecutive bins
    of 100, every bin: the piserini binning, on another quantity)."""
    return calibration_error([(v.confidence or 0.0) / 100 for v in judge], list(agrees))


def judge_agreement(
    first: str,
    second: str,
    verdicts: Mapping[str, Mapping[str, Judgement]],
    queries: Sequence[Query],
    answers: Mapping[str, str | None],
    seed: int = 0,
) -> JudgeAgreement:
    """`verdicts[judge][query_id]`; only `judged` verdicts count (a judge failure is no
    opinion). `queries` fixes the order and carries question and gold."""
    shared = [
        q
        for q in queries
        if all(
            verdicts[j].get(q.query_id) is not None and verdicts[j][q.query_id].status == "judged"
            for j in (first, second)
        )
    ]
    a = [bool(verdicts[first][q.query_id].correct) for q in shared]
    b = [bool(verdicts[second][q.query_id].correct) for q in shared]
    read = [
        (verdicts[first][q.query_id], verdicts[second][q.query_id])
        for q in shared
        if all(reads_own_confidence(verdicts[j][q.query_id]) for j in (first, second))
    ]
    agrees = [x.correct == y.correct for x, y in read]
    return JudgeAgreement(
        first=first,
        second=second,
        queries=len(shared),
        raw_agreement=sum(x == y for x, y in zip(a, b, strict=True)) / len(a) if a else None,
        kappa=cohens_kappa(a, b),
        kappa_ci95=paired_interval(a, b, cohens_kappa, seed),
        accuracy={first: sum(a) / len(a) if a else None, second: sum(b) / len(b) if b else None},
        disagreements=[
            Disagreement(
                query_id=q.query_id,
                question=q.query,
                answer=answers.get(q.query_id),
                gold=q.answer,
                verdicts={first: x, second: y},
            )
            for q, x, y in zip(shared, a, b, strict=True)
            if x != y
        ],
        calibration={
            first: own_calibration([x for x, _ in read], agrees),
            second: own_calibration([y for _, y in read], agrees),
        },
        calibration_queries=len(read),
    )


def _ce(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _cell(text: str | None, limit: int = 120) -> str:
    if text is None:
        return "(none)"
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def agreement_markdown(pairs: Sequence[JudgeAgreement]) -> str:
    if not pairs:
        return ""
    lines = [
        "### Judge agreement",
        "",
        "Over the queries both judges gave a verdict on; kappa is Cohen's, with a 95 % "
        "bootstrap interval over queries. Judge calibration: each judge's confidence in its own "
        "verdict against agreeing with the other (CE x 100, bins of 100; over the answers both "
        "read under our template; n/a under browsecomp-plus's, whose confidence is the "
        "response's).",
        "",
        "| judges | queries | raw agreement % | Cohen's κ [95% CI] | accuracy % (first) | "
        "accuracy % (second) | disagreements | judge calibration (first / second) |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]

    for p in pairs:
        kappa = "n/a" if p.kappa is None else f"{p.kappa:.3f}"
        if p.kappa_ci95 is not None:
            kappa += f" [{p.kappa_ci95[0]:.3f}, {p.kappa_ci95[1]:.3f}]"
        lines.append(
            f"| {p.first} vs {p.second} | {p.queries} | {percent(p.raw_agreement)} | {kappa} | "
            f"{percent(p.accuracy[p.first])} | {percent(p.accuracy[p.second])} | "
            f"{len(p.disagreements)} | {_ce(p.calibration.get(p.first))} / "
            f"{_ce(p.calibration.get(p.second))} ({p.calibration_queries} answers) |"
        )
    for p in pairs:
        if not p.disagreements:
            continue
        shown = p.disagreements[:SHOWN_DISAGREEMENTS]
        lines += [
            "",
            f"#### {p.first} vs {p.second}: where they disagree"
            + (
                f" (first {len(shown)} of {len(p.disagreements)}; all in summary.json)"
                if len(shown) < len(p.disagreements)
                else ""
            ),
            "",
            f"| query | question | answer | gold | {p.first} | {p.second} |",
            "|---|---|---|---|---|---|",
        ]
        for d in shown:
            lines.append(
                f"| {d.query_id} | {_cell(d.question)} | {_cell(d.answer, 60)} | "
                f"{_cell(d.gold, 60)} | {'right' if d.verdicts[p.first] else 'wrong'} | "
                f"{'right' if d.verdicts[p.second] else 'wrong'} |"
            )
    return "\n".join(lines) + "\n"
