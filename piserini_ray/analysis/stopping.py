"""Sweeps that stop a run once its comparison is decided (issue 52; `stop_when_decided` in a
sweep file).

Every run of the sweep takes its queries in one seeded random order (`shared_order`), so at
any moment the runs have answered about the same queries. `DecisionWatch` hears each record
and verdict from the runs' stores (it is their listener, like the status board) and keeps, for
each run against the reference, the paired outcomes of the longest prefix of that order that
both have verdicts for: the sequence the anytime-valid test (`metrics/sequential.py`) reads.
The prefix is fixed by the order, not by the outcomes, so the test's guarantee holds whatever
the arrival times: the chance that a run is ever decided in the wrong direction (or decided at
all when the accuracies are equal) is at most `alpha`, per comparison.

A decided run starts no new query; its queries in flight finish (what they cost is paid
already). The reference runs as long as any run still needs it. `decision.json` in each run
directory says what was decided, where, on what evidence and under which convention; resuming
reads the same verdicts in the same order and reaches the same decision, and `extend` lets the
decided runs go on in that order to the end of the slice.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from piserini_ray.metrics.sequential import CONCENTRATION, log_e_value
from piserini_ray.records import Judgement, QueryRecord
from piserini_ray.store import write_report_file

DECISION_FILE = "decision.json"
#: The only metric with a paired binary outcome per query (right or wrong under the judge).
PAIRED_BINARY_METRICS = ("accuracy",)
METHOD = (
    "anytime-valid paired test on discordant pairs: beta-binomial mixture e-value "
    f"(Beta({CONCENTRATION:g}, {CONCENTRATION:g})), decided when E >= 1/alpha (Ville's "
    "inequality); accuracy interval: beta-binomial mixture confidence sequence"
)

Log = Callable[[str], None]


class StopWhenDecided(BaseModel):
    """`stop_when_decided` of a sweep file: stop each run once its comparison with the
    reference is decided."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The reference run's swept values (default: the sweep's own `reference`).
    reference: dict[str, object] | None = None
    #: The chance, per comparison, of deciding wrongly (or at all when there is no difference).
    alpha: float = 0.05
    #: What is compared: a paired binary outcome per query.
    metric: str = "accuracy"
    #: No decision before this many paired queries (the test stays valid: it only looks later).
    min_queries: int = Field(0, ge=0)
    #: The seed of the queries' shared order.
    seed: int = 0

    @field_validator("alpha")
    @classmethod
    def _alpha_in_range(cls, alpha: float) -> float:
        if not 0 < alpha <= 0.5:
            raise ValueError(
                f"alpha {alpha} is outside (0, 0.5]: it is the chance of a wrong decision "
                "per comparison, e.g. 0.05"
            )
        return alpha

    @field_validator("metric")
    @classmethod
    def _paired_binary(cls, metric: str) -> str:
        if metric not in PAIRED_BINARY_METRICS:
            raise ValueError(
                f"metric {metric!r} is not a paired binary outcome per query, which the "
                f"sequential test needs; use one of {', '.join(PAIRED_BINARY_METRICS)}"
            )
        return metric


Role = Literal["reference", "compared"]


class Decision(BaseModel):
    """`decision.json`: where a run of a `stop_when_decided` sweep stands against its
    reference (the reference's own file says which runs it served)."""

    role: Role
    reference: str  # the reference run's directory
    alpha: float
    metric: str
    min_queries: int
    order_seed: int
    method: str = METHOD
    #: Paired queries seen (a prefix of the shared order), and the discordant ones.
    paired: int = 0
    wins: int = 0  # right in this run only
    losses: int = 0  # right in the reference only
    e_value: float = 1.0
    #: The paired query (1-based, in the shared order) at which the test decided.
    decided_at: int | None = None
    direction: Literal["better", "worse"] | None = None
    #: The decided run went on past its decision (`sweep --extend`).
    extended: bool = False
    #: For the reference: the runs compared with it, and whether each is decided.
    compared: dict[str, bool] = Field(default_factory=dict)


def shared_order(query_ids: Sequence[str], seed: int) -> list[str]:
    """The sweep's one order of its queries: the same for every run and every resume (a
    permutation of the sorted ids, so it depends on the set only, not on its listing)."""
    order = sorted(query_ids)
    random.Random(f"stop_when_decided:{seed}").shuffle(order)
    return order


@dataclass
class _Comparison:
    """One run against the reference: the paired prefix read so far and the test on it."""

    run: str
    reference: str
    paired: int = 0
    wins: int = 0
    losses: int = 0
    log_e: float = 0.0
    decided_at: int | None = None
    direction: Literal["better", "worse"] | None = None
    #: The counts at the decision (the evidence), kept when the prefix goes on (`extend`).
    evidence: tuple[int, int, float] | None = None


class _RunListener:
    """The watch's ear on one run's store (`store.StoreListener`)."""

    def __init__(self, watch: DecisionWatch, run: str) -> None:
        self.watch, self.run = watch, run

    def recorded(self, record: QueryRecord) -> None:
        self.watch.recorded(self.run, record)

    def judged(self, judgement: Judgement) -> None:
        self.watch.judged(self.run, judgement)


class DecisionWatch:
    """The decisions of one sweep's runs as their verdicts come (see the module's docstring).
    Runs are named by their run directories (absolute); `judges` gives each run's judge."""

    def __init__(
        self,
        settings: StopWhenDecided,
        reference: Path,
        runs: Sequence[Path],
        query_ids: Sequence[str],
        judges: dict[str, str],
        log: Log,
        extend: bool = False,
    ) -> None:
        self.settings = settings
        self.reference = str(reference)
        self.extend = extend
        self.order = shared_order(query_ids, settings.seed)
        self._position = {q: i for i, q in enumerate(self.order)}
        self._judges = judges
        self._log = log
        self._lock = threading.Lock()
        #: Each run's outcome per query (True right, False wrong), as far as it is final.
        self._outcomes: dict[str, dict[str, bool]] = {str(r): {} for r in runs}
        #: Queries whose record is a retryable failure: they run again, so their verdict
        #: (wrong, for an answer there is not) is no outcome.
        self._again: dict[str, set[str]] = {str(r): set() for r in runs}
        self.comparisons = {
            str(r): _Comparison(str(r), self.reference) for r in runs if str(r) != self.reference
        }
        self._said: set[str] = set()

    def position(self, query_id: str) -> int:
        """Where a query stands in the shared order (queries outside it last)."""
        return self._position.get(query_id, len(self.order))

    def listener(self, run: Path) -> _RunListener:
        return _RunListener(self, str(run))

    def load(
        self, run: Path, records: Sequence[QueryRecord], verdicts: dict[str, Judgement]
    ) -> None:
        """What a run's store holds already (a resume): the same verdicts in the same order
        reach the same decision."""
        for record in records:
            self.recorded(str(run), record)
        for judgement in verdicts.values():
            self.judged(str(run), judgement, evaluate=False)
        self._evaluate(str(run))

    # ------------------------------------------------------------- the stores' events

    def recorded(self, run: str, record: QueryRecord) -> None:
        with self._lock:
            if record.status == "failed" and record.retryable:
                self._again[run].add(record.query_id)
                self._outcomes[run].pop(record.query_id, None)
            else:
                self._again[run].discard(record.query_id)

    def judged(self, run: str, judgement: Judgement, evaluate: bool = True) -> None:
        if judgement.judge_model != self._judges.get(run) or judgement.status != "judged":
            return  # another judge's, or a failed one (judged again after the run)
        with self._lock:
            if judgement.query_id in self._again[run] or judgement.query_id not in self._position:
                return
            self._outcomes[run][judgement.query_id] = bool(judgement.correct)
        if evaluate:
            self._evaluate(run)

    # ------------------------------------------------------------- the decisions

    def _evaluate(self, run: str) -> None:
        """Read on along the shared order for every comparison `run` is part of; say each
        new decision (and write its file) once."""
        with self._lock:
            decided = self._read_on(run)
        for comparison in decided:
            self._announce(comparison)

    def _read_on(self, run: str) -> list[_Comparison]:
        """`_evaluate`'s arithmetic, under the lock: the comparisons decided just now."""
        decided = []
        touched = (
            list(self.comparisons.values())
            if run == self.reference
            else [self.comparisons[run]]
            if run in self.comparisons
            else []
        )
        reference = self._outcomes[self.reference]
        threshold = math.log(1 / self.settings.alpha)
        for comparison in touched:
            other = self._outcomes[comparison.run]
            while comparison.paired < len(self.order):
                query = self.order[comparison.paired]
                if query not in reference or query not in other:
                    break
                comparison.paired += 1
                comparison.wins += other[query] and not reference[query]
                comparison.losses += reference[query] and not other[query]
                comparison.log_e = log_e_value(comparison.wins, comparison.losses)
                if (
                    comparison.decided_at is None
                    and comparison.log_e >= threshold
                    and comparison.paired >= self.settings.min_queries
                ):
                    comparison.decided_at = comparison.paired
                    comparison.direction = (
                        "better" if comparison.wins > comparison.losses else "worse"
                    )
                    comparison.evidence = (
                        comparison.wins,
                        comparison.losses,
                        math.exp(comparison.log_e),
                    )
            if comparison.decided_at is not None and comparison.run not in self._said:
                self._said.add(comparison.run)
                decided.append(comparison)
        return decided

    def _announce(self, comparison: _Comparison) -> None:
        wins, losses, e_value = comparison.evidence or (0, 0, 1.0)
        then = (
            "it goes on to the end (--extend)"
            if self.extend
            else "it starts no new query; its queries in flight finish"
        )
        self._log(
            f"{comparison.run}: decided {comparison.direction} than the reference at "
            f"{comparison.decided_at} paired queries ({wins} won, {losses} lost of the "
            f"discordant, E = {e_value:.1f} >= {1 / self.settings.alpha:g}); {then}"
        )
        self.write(comparison.run)

    def halted(self, run: Path) -> str | None:
        """Why `run` starts no new query now (None: it goes on)."""
        name = str(run)
        with self._lock:
            if self.extend:
                return None
            if name == self.reference:
                if self.comparisons and all(
                    c.decided_at is not None for c in self.comparisons.values()
                ):
                    return "every run compared with it is decided (stop_when_decided)"
                return None
            comparison = self.comparisons.get(name)
            if comparison is None or comparison.decided_at is None:
                return None
            return (
                f"decided {comparison.direction} than the reference at "
                f"{comparison.decided_at} paired queries (stop_when_decided, alpha "
                f"{self.settings.alpha:g}); `sweep --extend` runs the rest in the same order"
            )

    def decision(self, run: Path) -> Decision:
        """The run's `decision.json` as it stands."""
        name = str(run)
        settings = self.settings
        common = {
            "reference": self.reference,
            "alpha": settings.alpha,
            "metric": settings.metric,
            "min_queries": settings.min_queries,
            "order_seed": settings.seed,
        }
        with self._lock:
            if name == self.reference:
                compared = {c.run: c.decided_at is not None for c in self.comparisons.values()}
                return Decision(role="reference", compared=compared, **common)
            c = self.comparisons[name]
            wins, losses, e_value = c.evidence or (c.wins, c.losses, math.exp(c.log_e))
            return Decision(
                role="compared",
                paired=c.decided_at or c.paired,
                wins=wins,
                losses=losses,
                e_value=e_value,
                decided_at=c.decided_at,
                direction=c.direction,
                extended=self.extend and c.decided_at is not None,
                **common,
            )

    def write(self, run: str | Path) -> None:
        """Write the run's `decision.json` (at its decision, and for every run at the end)."""
        write_report_file(
            Path(run) / DECISION_FILE, self.decision(Path(run)).model_dump_json(indent=1)
        )


def read_decision(run_dir: Path) -> Decision | None:
    """A run's `decision.json`, if it was part of a `stop_when_decided` sweep."""
    path = Path(run_dir) / DECISION_FILE
    if not path.exists():
        return None
    return Decision.model_validate_json(path.read_bytes())
