"""Other harnesses' files and tables: export and import runs, check the pricing table, serve the
offline models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from piserini_ray.api._common import stderr_log
from piserini_ray.config import RunConfig

if TYPE_CHECKING:
    from piserini_ray.engines.contract import Log
    from piserini_ray.formats.importer import ImportSummary
    from piserini_ray.formats.peer_files import Format
    from piserini_ray.metrics.cost import PriceDifference


def export(
    run_dir: str | Path, format: str, out: str | Path, *, log: Log | None = None
) -> list[Path]:
    """Write a run in another harness's format: what `piserini-ray export` does.

    Args:
        run_dir: the run directory (read with its own manifest's config).
        format: `browsecomp-plus`, `pi-serini` or `trec`.
        out: the folder the files go to.
        log: where progress lines go (default: standard error).

    Returns:
        The files written.

    Raises:
        ConfigError: the format is not one of those above.

    Example:
        ```python
        from piserini_ray import export

        print(export("runs/sample-offline_heuristic-1a2b3c4d", "trec", "runs/trec"))
        ```
    """
    from piserini_ray.formats.exporter import export_run

    return export_run(Path(run_dir), format, Path(out), log or stderr_log)


@dataclass
class ImportReport:
    """What `import_runs` imported, and what the format could not say.

    Args:
        summary: the import's counts, statuses, notes, settings and cost as the files state
            them (`ImportSummary`).
        unavailable: each part the format lacks, with what is n/a in the report for it (never
            0), in `summary.unavailable`'s order.

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import import_runs, load_config

        result = import_runs("peer-runs", "pi-serini", load_config())
        print(result.summary.imported, list(result.unavailable))
        ```
    """

    summary: ImportSummary
    unavailable: dict[str, str]


def import_runs(
    folder: str | Path,
    format: Format,
    config: RunConfig,
    run_dir: str | Path | None = None,
    *,
    log: Log | None = None,
) -> ImportReport:
    """Import another harness's run files as a run directory over the config's benchmark, to
    judge and report as any run: what `piserini-ray import` does. Queries the directory holds
    already are skipped.

    Args:
        folder: a folder of run files (or one file).
        format: the files' format (`browsecomp-plus` or `pi-serini`).
        config: the run config whose benchmark and slice the files answer.
        run_dir: the run directory (default: the one `run` would use for this config).
        log: where progress lines go (default: standard error).

    Returns:
        An `ImportReport`: what was imported and what the format lacks.

    Raises:
        ConfigError: an unknown format, or a config with several epochs.

    Example:
        ```python
        from piserini_ray import import_runs, judge, load_config

        result = import_runs("peer-runs", "pi-serini", load_config())
        judge(result.summary.run_dir)
        ```
    """
    from piserini_ray.formats.importer import MEANING
    from piserini_ray.formats.importer import import_runs as import_files

    directory = Path(run_dir) if run_dir is not None else None
    summary = import_files(Path(folder), format, config, directory, log or stderr_log)
    return ImportReport(summary, {part: MEANING[part] for part in summary.unavailable})


@dataclass
class PricingCheck:
    """What `pricing_check` compared.

    Args:
        table: the pricing table's file.
        differences: each model and price where the table and litellm disagree (USD per
            million tokens; `field == "model"`: litellm does not know the model).

    Returns:
        A plain dataclass: read its attributes.

    Example:
        ```python
        from piserini_ray import pricing_check

        print(len(pricing_check().differences))
        ```
    """

    table: str
    differences: list[PriceDifference]


def pricing_check(table: str | Path | None = None) -> PricingCheck:
    """The pricing table against litellm's bundled price map: what `piserini-ray pricing
    check` does (in a run the table wins; this says where litellm disagrees).

    Args:
        table: a pricing table (default: the package's own, `configs/pricing.yaml`).

    Returns:
        A `PricingCheck`: the table's file and every difference.

    Example:
        ```python
        from piserini_ray import pricing_check

        for d in pricing_check().differences:
            print(d.model, d.field, d.ours, d.litellm)
        ```
    """
    from piserini_ray.metrics.cost import load_pricing, price_differences

    pricing = load_pricing(Path(table) if table is not None else None)
    return PricingCheck(pricing.path, price_differences(pricing))


def serve_offline(config: RunConfig, port: int | None = None) -> None:
    """Serve the offline models on 127.0.0.1 (an OpenAI-compatible endpoint) until Ctrl-C or
    SIGTERM, printing the base URL: what `piserini-ray offline-provider` does.

    Args:
        config: the run config: its `offline` settings (models, aliases, port).
        port: the port (default: `offline.port`; 0: any free port).

    Returns:
        Nothing, once interrupted.

    Example:
        ```python
        from piserini_ray import load_config, serve_offline

        serve_offline(load_config(), port=8000)
        ```
    """
    from piserini_ray.offline import serve

    serve(config.offline, host="127.0.0.1", port=port)
