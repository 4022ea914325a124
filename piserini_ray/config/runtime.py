"""The `runtime` section: where and how wide a run executes (Ray, replicas, failure policy,
runs root, batched turns). None of it is part of a run's identity."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from piserini_ray.config.base import StrictModel, default_home


class TurnBatchConfig(StrictModel):
    """Batched agent turns (`model.service_tier: batch`, `llm/batcher.py`)."""

    # Not identity: how the turns travel, not what they answer.
    IDENTITY = ()
    NOT_IDENTITY = ("gather_seconds", "poll_seconds", "queries_at_once")

    #: Seconds a round waits after its first turn for the other queries' turns.
    gather_seconds: float = Field(2.0, ge=0)
    #: How often a batch in flight is asked whether it has finished.
    poll_seconds: float = Field(30.0, gt=0)
    #: Queries whose loops run at once (each waits on the batch, not on a CPU).
    queries_at_once: int = Field(256, ge=1)


class RuntimeConfig(StrictModel):
    """Where and how wide a run executes. Not part of a run's identity: a run started on a
    laptop can be resumed on a cluster."""

    # Not identity: where and how wide a run executes: a laptop run resumes on a cluster.
    IDENTITY = ()
    NOT_IDENTITY = (
        "address",
        "num_cpus",
        "object_store_mb",
        "dashboard",
        "replicas",
        "cpus_per_replica",
        "max_concurrency",
        "max_restarts",
        "placement",
        "max_infrastructure_attempts",
        "max_failure_rate",
        "status_seconds",
        "metrics_export_port",
        "traces_endpoint",
        "runs_root",
        "batch",
    )

    #: None: start a local Ray sized by `num_cpus`; "auto" (or an address): attach to a cluster.
    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)  # local Ray only; default: this machine's cores
    object_store_mb: int = Field(256, ge=64)
    #: A local Ray's dashboard. Off, the local Ray starts only what a run uses: no API server
    #: (Ray starts one even without the dashboard, and waits for it), no autoscaler monitor
    #: and a minimal dashboard agent (`engines/ray/ray_env._lean_start`).
    dashboard: bool = False
    #: A local Ray's Prometheus metrics port (Ray's and ours, `ray_piserini_*`: the Ray guide's
    #: metrics section). Set, the local Ray starts its full dashboard agent, which serves them.
    #: A cluster's is its own (`ray start --metrics-export-port`).
    metrics_export_port: int | None = Field(None, ge=1, le=65535)
    #: Where each query's OpenTelemetry trace goes (an OTLP/HTTP base such as
    #: `http://127.0.0.1:6006`, or its `/v1/traces` URL); unset, the standard
    #: `OTEL_EXPORTER_OTLP_ENDPOINT` is used if set, else no trace is made.
    traces_endpoint: str | None = None
    replicas: int = Field(1, ge=1)
    cpus_per_replica: float = Field(1.0, gt=0)
    #: Agent loops one replica runs at once (they mostly wait on the model).
    max_concurrency: int = Field(8, ge=1)
    max_restarts: int = Field(3, ge=0)
    placement: Literal["spread", "pack"] = "spread"
    #: Attempts of a query lost to dead actors or nodes before it is recorded as failed.
    max_infrastructure_attempts: int = Field(3, ge=1)
    #: When more than this share of a run's queries to do has failed, no new query starts and
    #: the run exits non-zero with the top causes (a broken model or endpoint, not bad luck).
    max_failure_rate: float = Field(0.05, ge=0, le=1)
    #: How often the driver rewrites each run's live status (`status.json`) while it changes.
    status_seconds: float = Field(2.0, gt=0, le=60)
    #: Where run directories go unless `--run-dir` names one: an absolute folder on the
    #: driver's node (default `$PISERINI_RAY_HOME/runs`), never the job's working directory,
    #: which `ray job submit` copies anew for every job.
    runs_root: Path | None = None
    #: How agent turns are gathered into provider batches (`model.service_tier: batch`).
    batch: TurnBatchConfig = TurnBatchConfig()

    def resolved_runs_root(self) -> Path:
        root = self.runs_root if self.runs_root is not None else default_home() / "runs"
        return root.expanduser().absolute()
