"""A panel of judges (`judge.models: [A, B, C]`): every answer judged by each, the verdict their
majority. Judges differ (swapping GPT-4.1 for another moved BrowseComp-Plus accuracy about 6
points), so the report shows accuracy under each judge and under the panel, Fleiss' kappa of
the panel, and the answers the judges split on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel

from piserini_ray.metrics.paired import fleiss_kappa
from piserini_ray.records import Judgement, Usage
from piserini_ray.reports._format import percent
from piserini_ray.reports.agreement import own_calibration, reads_own_confidence

Ties = Literal["incorrect", "correct"]


def panel_name(judges: Sequence[str]) -> str:
    return "panel(" + ", ".join(judges) + ")"


def panel_verdicts(
    verdicts: Mapping[str, Mapping[str, Judgement]], judges: Sequence[str], ties: Ties
) -> dict[str, Judgement]:
    """One verdict per query from the judges' `judged` verdicts: the majority; a tie goes to
    `ties` and says so (`reasoning` begins "tie"). A query no judge could judge is
    `judge_failed`, never scored as wrong. Usage is the judges' together."""
    name = panel_name(judges)
    query_ids = sorted({q for j in judges for q in verdicts.get(j, {})})
    panel = {}
    for query_id in query_ids:
        mine = [verdicts[j][query_id] for j in judges if query_id in verdicts.get(j, {})]
        usage = sum((v.usage for v in mine), Usage())
        votes = [v.correct for v in mine if v.status == "judged" and v.correct is not None]
        if not votes:
            panel[query_id] = Judgement(
                query_id=query_id, judge_model=name, status="judge_failed", usage=usage,
                error="no judge of the panel could judge this answer",
            )  # fmt: skip
            continue
        yes, no = votes.count(True), votes.count(False)
        tie = yes == no
        correct = (ties == "correct") if tie else yes > no
        reasoning = (
            f"tie {yes}-{no}, counted {ties} (judge.panel_ties)"
            if tie
            else f"majority {max(yes, no)} of {len(votes)}"
        )
        first = next(v for v in mine if v.status == "judged")
        panel[query_id] = Judgement(
            query_id=query_id, judge_model=name, status="judged", correct=correct,
            confidence=100.0 * max(yes, no) / len(votes), reasoning=reasoning,
            correct_answer=first.correct_answer, usage=usage,
        )  # fmt: skip
    return panel


class PanelSummary(BaseModel):
    judges: list[str]
    ties_count_as: Ties
    #: Queries every judge of the panel judged: the kappa and the per-judge accuracies are
    #: over these.
    queries: int
    accuracy: dict[str, float | None]  # judge (and the panel) -> accuracy
    fleiss_kappa: float | None
    ties: list[str]  # query ids whose votes tied
    split: list[str]  # query ids the judges did not all agree on
    #: Judge calibration: judge -> CE x 100 of its confidence in its own verdict against
    #: agreeing with the panel's majority (which it is part of), over the shared answers it
    #: read under our template (`agreement.reads_own_confidence`).
    calibration: dict[str, float | None] = {}


def panel_summary(
    verdicts: Mapping[str, Mapping[str, Judgement]], judges: Sequence[str], ties: Ties
) -> PanelSummary:
    panel = panel_verdicts(verdicts, judges, ties)

    def judged(judge: str, query_id: str) -> bool:
        v = verdicts.get(judge, {}).get(query_id)
        return v is not None and v.status == "judged" and v.correct is not None

    shared = [q for q in sorted(panel) if all(judged(j, q) for j in judges)]
    table = [[bool(verdicts[j][q].correct) for j in judges] for q in shared]
    accuracy: dict[str, float | None] = {
        j: (sum(row[i] for row in table) / len(table) if table else None)
        for i, j in enumerate(judges)
    }
    accuracy[panel_name(judges)] = (
        sum(bool(panel[q].correct) for q in shared) / len(shared) if shared else None
    )
    return PanelSummary(
        judges=list(judges),
        ties_count_as=ties,
        queries=len(shared),
        accuracy=accuracy,
        fleiss_kappa=fleiss_kappa(table) if table else None,
        ties=[q for q in shared if (panel[q].reasoning or "").startswith("tie")],
        split=[q for q, row in zip(shared, table, strict=True) if len(set(row)) > 1],
        calibration={j: _against_majority(verdicts[j], panel, shared) for j in judges},
    )


def _against_majority(
    mine: Mapping[str, Judgement], panel: Mapping[str, Judgement], shared: Sequence[str]
) -> float | None:
    read = [mine[q] for q in shared if reads_own_confidence(mine[q])]
    return own_calibration(read, [v.correct == panel[v.query_id].correct for v in read])


def panel_markdown(panel: PanelSummary) -> str:
    kappa = "n/a" if panel.fleiss_kappa is None else f"{panel.fleiss_kappa:.3f}"
    lines = [
        "### Judge panel",
        "",
        f"The run's verdict is the majority of {len(panel.judges)} judges (a tie counts as "
        f"{panel.ties_count_as} and is flagged). Over the {panel.queries} queries every judge "
        f"judged: Fleiss' κ {kappa}; {len(panel.split)} answers split the judges, "
        f"{len(panel.ties)} of them tied.",
        "",
        "| judge | accuracy % |",
        "|---|---:|",
        *(f"| {judge} | {percent(acc)} |" for judge, acc in panel.accuracy.items()),
    ]
    if panel.calibration:
        lines += [
            "",
            "Judge calibration (each judge's confidence in its own verdict against agreeing "
            "with the majority, CE x 100): "
            + ", ".join(
                f"{j} {'n/a' if ce is None else f'{ce:.1f}'}" for j, ce in panel.calibration.items()
            )
            + ".",
        ]
    if panel.split:
        lines += ["", "Split answers: " + ", ".join(panel.split[:50])]
    return "\n".join(lines) + "\n"
