"""Analyses of finished runs, nothing called: paired comparisons, leaderboards, power, a run's
records and where its evidence sat."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray.api._common import stderr_log
from piserini_ray.errors import ConfigError

if TYPE_CHECKING:
    from piserini_ray.engines.contract import Log
    from piserini_ray.records import QueryRecord
    from piserini_ray.reports.comparison import PairedComparison, PilotPower
    from piserini_ray.reports.leaderboard import Leaderboard


@dataclass
class PairedReport:
    """What `compare` found and wrote.

    Args:
        comparisons: each run against the reference, over the queries they share.
        table: the comparisons in markdown (what `piserini-ray compare` prints).
        files: `compare.md` and `compare.json` when an `out` folder was given, else none.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import compare

        print(compare("runs/a", ["runs/b"]).table)
        ```
    """

    comparisons: list[PairedComparison]
    table: str
    files: list[Path] = field(default_factory=list)


def compare(
    reference: str | Path,
    others: Sequence[str | Path],
    *,
    seed: int = 0,
    out: str | Path | None = None,
    log: Log | None = None,
) -> PairedReport:
    """Paired comparisons of runs against a reference run, over the queries they share, from
    each run's own judge's verdicts (no model is called): what `piserini-ray compare` does.

    Args:
        reference: the reference run's directory.
        others: the directories of the runs compared with it.
        seed: the bootstrap's seed (the intervals are reproducible).
        out: a folder for `compare.md` and `compare.json`; `None`: nothing is written.
        log: where progress lines go (default: standard error).

    Returns:
        A `PairedReport`: the comparisons, their markdown table and the files written.

    Example:
        ```python
        from piserini_ray import compare

        result = compare("runs/a", ["runs/b", "runs/c"], out="runs/a-vs-others")
        print(result.table)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.reports.comparison import paired_markdown

    comparisons = pipeline.compare(
        Path(reference), [Path(d) for d in others], log or stderr_log, seed
    )
    result = PairedReport(comparisons, paired_markdown(comparisons))
    if out is not None:
        from piserini_ray.reports.writers import write_comparison

        result.files = list(write_comparison(comparisons, result.table, Path(out)))
    return result


@dataclass
class LeaderboardReport:
    """What `leaderboard` ranked and wrote.

    Args:
        board: the rows, best first, each tested against the top row.
        table: the leaderboard in markdown (what `piserini-ray leaderboard` prints).
        files: the files written when an `out` folder was given, else none.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import leaderboard

        print(leaderboard(["runs/a", "runs/b"]).table)
        ```
    """

    board: Leaderboard
    table: str
    files: list[Path] = field(default_factory=list)


def leaderboard(
    run_dirs: Sequence[str | Path],
    *,
    seed: int = 0,
    out: str | Path | None = None,
    log: Log | None = None,
) -> LeaderboardReport:
    """Rank runs of one benchmark (ours and imported), each tested against the top one by
    the exact McNemar test, Holm-corrected, from what is judged already (no model is called):
    what `piserini-ray leaderboard` does.

    Args:
        run_dirs: the runs' directories.
        seed: the bootstrap's seed (the intervals are reproducible).
        out: a folder for the leaderboard's markdown, HTML and JSON; `None`: nothing written.
        log: where progress lines go (default: standard error).

    Returns:
        A `LeaderboardReport`: the rows, their markdown table and the files written.

    Raises:
        ConfigError: the runs cannot be ranked together (e.g. not of one benchmark).

    Example:
        ```python
        from piserini_ray import leaderboard

        result = leaderboard(["runs/a", "runs/b"], out="runs/board")
        print(result.board.rows[0].model)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.reports import leaderboard as board

    say = log or stderr_log
    try:
        ranked = board.leaderboard([pipeline.run_figures(Path(d), say) for d in run_dirs], seed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    result = LeaderboardReport(ranked, board.leaderboard_markdown(ranked))
    if out is not None:
        result.files = board.write_leaderboard(ranked, Path(out))
    return result


@dataclass
class PowerReport:
    """What `power` sized.

    Args:
        pilot: the pilot's accuracy, the discordance assumed and the queries each effect needs.
        table: the sizing in markdown (what `piserini-ray power` prints).

    Returns:
        A plain dataclass: read its attributes (`pilot.figures.discordance` is `None` when
        nothing could be sized: pass a `discordance`).

    Example:
        ```python
        from piserini_ray import power

        print(power("runs/pilot").table)
        ```
    """

    pilot: PilotPower
    table: str


def power(
    run_dir: str | Path,
    *,
    effects: Sequence[float] = (),
    discordance: float | None = None,
    log: Log | None = None,
) -> PowerReport:
    """Size a run from one pilot run: the queries each assumed accuracy difference needs to be
    detected (exact McNemar, 80 % power): what `piserini-ray power` does.

    Args:
        run_dir: the pilot run's directory (judged).
        effects: accuracy differences to detect, fractions in (0, 1] (0.02 = 2 points);
            empty: 1, 2 and 5 points.
        discordance: the fraction of queries two runs disagree on, when known; `None`: assumed
            from the pilot's accuracy (the output says so).
        log: where progress lines go (default: standard error).

    Returns:
        A `PowerReport`: the figures and their markdown.

    Raises:
        ConfigError: an effect or the discordance is outside (0, 1].

    Example:
        ```python
        from piserini_ray import power

        print(power("runs/pilot", effects=[0.02, 0.05]).table)
        ```
    """
    from piserini_ray import pipeline
    from piserini_ray.reports.comparison import EFFECTS, pilot_power, power_markdown

    sizes = list(effects) or list(EFFECTS)
    if any(not 0 < e <= 1 for e in sizes) or not (discordance is None or 0 < discordance <= 1):
        raise ConfigError("--effect and --discordance are fractions in (0, 1]: 0.02 = 2 points")
    pilot = pilot_power(pipeline.run_facts(Path(run_dir), log or stderr_log), sizes, discordance)
    return PowerReport(pilot, power_markdown(pilot))


def read_records(run_dir: str | Path) -> list[QueryRecord]:
    """The records a run holds (`records.jsonl`, as its store reads it), under its own
    manifest's config.

    Args:
        run_dir: the run directory.

    Returns:
        Each recorded query's `QueryRecord`.

    Example:
        ```python
        from piserini_ray import read_records

        print([r.status for r in read_records("runs/sample-offline_heuristic-1a2b3c4d")])
        ```
    """
    from piserini_ray.store import RunStore, manifest_config

    with RunStore(Path(run_dir), manifest_config(Path(run_dir))) as store:
        return list(store.records())


def evidence_ranks(run_dir: str | Path, *, log: Log | None = None) -> Path:
    """Where a run's evidence documents sat in its rankings (best rank, previewed, opened),
    written beside the run's reports: what `piserini-ray evidence-ranks` does.

    Args:
        run_dir: the run directory (read with its own manifest's config).
        log: where progress lines go (default: standard error).

    Returns:
        The markdown summary written (`evidence_ranks.md`; `evidence_ranks.csv` and
        `evidence_ranks.png` beside it).

    Example:
        ```python
        from piserini_ray import evidence_ranks

        print(evidence_ranks("runs/sample-offline_heuristic-1a2b3c4d").read_text())
        ```
    """
    from piserini_ray.data import load_benchmark
    from piserini_ray.reports.evidence import evidence_ranks as ranks
    from piserini_ray.reports.evidence import write_evidence_ranks
    from piserini_ray.store import RunStore, manifest_config

    config = manifest_config(Path(run_dir))
    benchmark = load_benchmark(config.benchmark)
    with RunStore(Path(run_dir), config, log=log or stderr_log) as store:
        rows = ranks(store.records(), store.rankings(), benchmark)
    return write_evidence_ranks(rows, Path(run_dir))
