"""What every command shares: the log line, the config from the arguments and its
overrides, the shared arguments."""

from __future__ import annotations

import argparse
import sys

from piserini_ray.config import RunConfig, load_config


def log(message: str) -> None:
    """A progress line on standard error (standard output holds what a command prints)."""
    print(f"[piserini-ray] {message}", file=sys.stderr, flush=True)


def config_from(args: argparse.Namespace) -> RunConfig:
    """The run config a command names (`--config`, default the embedded sample) with the
    command's overrides (`--k1`, `--b`, `--backend`, `--preset`, `--index-root`,
    `--runs-root`, `--epochs`) applied."""
    overrides: dict[str, object] = {}
    if getattr(args, "k1", None) is not None:
        overrides["retrieval.bm25.k1"] = args.k1
    if getattr(args, "b", None) is not None:
        overrides["retrieval.bm25.b"] = args.b
    if getattr(args, "backend", None) is not None:
        overrides["retrieval.backend"] = args.backend
    if getattr(args, "preset", None) is not None:
        overrides["retrieval.preset"] = args.preset
    if getattr(args, "index_root", None) is not None:
        overrides["retrieval.index_root"] = str(args.index_root)
    if getattr(args, "runs_root", None) is not None:
        overrides["runtime.runs_root"] = str(args.runs_root.absolute())
    if getattr(args, "epochs", None) is not None:
        overrides["run.epochs"] = args.epochs
    return load_config(args.config, overrides)


def with_epochs(config: RunConfig, epochs: int | None) -> RunConfig:
    """`config` with `--epochs` applied (more epochs are added to the same run)."""
    if epochs is None:
        return config
    return config.model_copy(update={"run": config.run.model_copy(update={"epochs": epochs})})


def epochs_argument(p: argparse.ArgumentParser) -> None:
    """`--epochs K` on a command that runs queries."""
    p.add_argument(
        "--epochs",
        type=int,
        metavar="K",
        help="run each query K times with distinct seeds (run.epochs); epoch e > 1 goes to "
        "<run dir>/epochs/<e>, and the report adds mean ± sd, pass@k and pass^k",
    )


def engine_arguments(p: argparse.ArgumentParser) -> None:
    """`--engine` and `--concurrency` on a command that runs queries."""
    p.add_argument(
        "--engine",
        choices=("ray", "local"),
        default="ray",
        help="ray: searcher replicas on a Ray cluster (default); local: this process only",
    )
    p.add_argument("--concurrency", type=int, default=4, help="queries at once (local engine)")


def encoder_label(config: RunConfig) -> str:
    """The config's dense encoder in words (for what a command prints)."""
    from piserini_ray.retrieval.encoder import encoder_label as label

    return label(config.retrieval.dense)
