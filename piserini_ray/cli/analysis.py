"""Analyses of finished runs (compare, leaderboard, power, evidence ranks), their export and
import, and the pricing table's check: parse, call the API, print."""

from __future__ import annotations

import argparse
from pathlib import Path

from piserini_ray.cli.common import config_from, log
from piserini_ray.errors import ConfigError


def cmd_pricing_check(args: argparse.Namespace) -> int:
    """The pricing table against litellm's bundled price map: every difference listed; exit 1
    when there is one (the table wins in a run; this says where litellm disagrees)."""
    from piserini_ray import api

    check = api.pricing_check(args.table)
    differences = check.differences
    print(f"pricing table {check.table} against litellm's price map (USD per million tokens):")
    for d in differences:
        if d.field == "model":
            print(f"  {d.model}: not in litellm's map")
        else:
            print(f"  {d.model} {d.field}: table {d.ours}, litellm {d.litellm}")
    print(f"{len(differences)} difference(s)" if differences else "no differences")
    return 1 if differences else 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired comparison of runs against the first, over the queries they share (no model is
    called: each run's own judge's verdicts)."""
    from piserini_ray import api

    if len(args.run_dirs) < 2:
        raise ConfigError("compare needs two run directories or more: REFERENCE RUN [RUN ...]")
    result = api.compare(args.run_dirs[0], args.run_dirs[1:], seed=args.seed, out=args.out, log=log)
    print(result.table)
    if args.out is not None:
        print(f"wrote {result.files[0].absolute()} and compare.json")
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    """Rank runs of one benchmark, each tested against the top (reports/leaderboard.py)."""
    from piserini_ray import api

    result = api.leaderboard(args.run_dirs, seed=args.seed, out=args.out, log=log)
    print(result.table)
    if args.out is not None:
        print("wrote " + ", ".join(str(p.absolute()) for p in result.files))
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    """Size a run from one pilot: the queries each assumed effect needs (exact McNemar)."""
    from piserini_ray import api

    result = api.power(
        args.run_dir, effects=args.effect or (), discordance=args.discordance, log=log
    )
    print(result.table)
    # nothing sized: --discordance asked
    return 2 if result.pilot.figures.discordance is None else 0


def cmd_export(args: argparse.Namespace) -> int:
    """A run in another format (`formats/exporter.py`: one entry per format)."""
    from piserini_ray import api

    paths = api.export(args.run_dir, args.format, args.out, log=log)
    print(f"wrote {len(paths)} file(s) to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Another harness's run files as a run directory over the config's benchmark
    (`formats/importer.py`); what their format lacks is n/a in the report, never 0."""
    from piserini_ray import api

    result = api.import_runs(args.dir, args.format, config_from(args), args.run_dir, log=log)
    s = result.summary
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))
    print(
        f"imported {s.imported} quer{'y' if s.imported == 1 else 'ies'} from {s.source} "
        f"({s.format}) into {s.run_dir}" + (f": {statuses}" if statuses else "")
    )
    print(f"skipped {s.skipped} already recorded")
    print(f"read {s.files_read} file(s); {len(s.skipped_files)} run(s) skipped")
    for skip in s.skipped_files:
        print(f"  skipped {skip.file}: {skip.reason}")
    for note in s.notes:
        print(f"note: {note}")
    print(f"as the files state it: {s.settings}")
    print(f"cost: {s.cost}")
    if s.without_file:
        print(f"{s.without_file} queries of the config's slice have no run file in the folder")
    if s.unavailable:
        print(f"not in the {s.format} format, reported as n/a (never 0):")
        for part, meaning in result.unavailable.items():
            print(f"  {part}: {meaning}")
    print(f"next: piserini-ray judge {s.run_dir}\n      piserini-ray report {s.run_dir}")
    return 0


def cmd_evidence_ranks(args: argparse.Namespace) -> int:
    """Where the run's evidence sat in its rankings (`reports/evidence.py` writes the files)."""
    from piserini_ray import api

    path = api.evidence_ranks(args.run_dir, log=log)
    print(path.read_text())
    print(f"also {Path(args.run_dir) / 'evidence_ranks.png'} and evidence_ranks.csv")
    return 0
