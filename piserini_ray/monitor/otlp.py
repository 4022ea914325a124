"""Whether a run sends traces, and where: the one place that reads the OTLP settings, without
importing OpenTelemetry (`monitor/traces.py` is imported only when traces are on)."""

from __future__ import annotations

import os

from piserini_ray.config import RunConfig


def traces_endpoint(config: RunConfig) -> str | None:
    """The OTLP/HTTP traces URL of the run (`runtime.traces_endpoint`, else the standard
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`);
    None: traces are off."""
    if config.runtime.traces_endpoint:
        return _traces_url(config.runtime.traces_endpoint)
    if explicit := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return explicit
    if base := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return _traces_url(base)
    return None


def _traces_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"
