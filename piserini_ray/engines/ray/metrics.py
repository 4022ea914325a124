"""A run's figures as Ray metrics (`ray.util.metrics`), for Prometheus and Ray's dashboard.

The driver exports them, tagged by run and model, from the same events its store records
(`RunExporter` is a store listener, like the status board): queries by status, tokens by kind,
cost, retried attempts by failure class, verdicts, and from each record's trajectory the model
calls' and tools' latencies and the waits on the limiter; the dispatcher adds the gauges
(queries running, calls waiting on the limiter, replicas by node). Ray's metrics agent on the
driver's node serves them on its metrics export port (`ray start --metrics-export-port`, or
`runtime.metrics_export_port` for a local Ray) as `ray_piserini_*`; `configs/grafana/` holds a
dashboard of them. Nothing is exported by replicas: a number is counted once, where its record is
written.
"""

from __future__ import annotations

import functools
from collections import Counter as Tally
from typing import Any

from ray.util.metrics import Counter, Gauge, Histogram

from piserini_ray.engines.contract import PreparedRun
from piserini_ray.monitor.board import retry_class
from piserini_ray.records import Judgement, QueryRecord, Usage

RUN_TAGS = ("run", "model")
#: Seconds: model calls and tools take from milliseconds to minutes.
LATENCY_BOUNDARIES = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]


@functools.cache
def _metrics() -> dict[str, Any]:
    """The metric objects, made once per process (Ray must be up)."""
    latency = {"boundaries": LATENCY_BOUNDARIES}
    return {
        "queries": Counter(
            "piserini_queries", "Queries recorded, by status", (*RUN_TAGS, "status")
        ),
        "tokens": Counter(
            "piserini_tokens", "Tokens of recorded queries, by kind", (*RUN_TAGS, "kind")
        ),
        "cost": Counter("piserini_cost_usd", "USD of recorded queries (priced models)", RUN_TAGS),
        "retries": Counter(
            "piserini_retries",
            "Retried model-call attempts, by failure class",
            (*RUN_TAGS, "class"),
        ),
        "verdicts": Counter(
            "piserini_verdicts", "Judge verdicts: correct, wrong, failed", (*RUN_TAGS, "verdict")
        ),
        "model_seconds": Histogram(
            "piserini_model_call_seconds", "Model call latency", tag_keys=RUN_TAGS, **latency
        ),
        "tool_seconds": Histogram(
            "piserini_tool_seconds", "Tool call latency", tag_keys=(*RUN_TAGS, "tool"), **latency
        ),
        "waited_seconds": Histogram(
            "piserini_limiter_wait_seconds",
            "Seconds a model turn waited on limiters and back-off",
            tag_keys=RUN_TAGS,
            **latency,
        ),
        "running": Gauge("piserini_queries_running", "Queries in flight", RUN_TAGS),
        "waiting": Gauge(
            "piserini_calls_waiting", "Model calls waiting on the run's limiter", RUN_TAGS
        ),
        "replicas": Gauge("piserini_replicas", "Searcher replicas, by node", (*RUN_TAGS, "node")),
    }


class RunExporter:
    """One run's metrics, told of each record and verdict by its store."""

    def __init__(self, run: PreparedRun) -> None:
        self.tags = {"run": run.run_dir.name, "model": run.config.model.name}
        price = run.pricing.model_price(run.config.model)
        self.price = price
        self.wanted = run.wanted
        self.judge = run.config.judge_model().name
        self.metrics = _metrics()
        self._nodes: set[str] = set()

    def _tagged(self, **more: str) -> dict[str, str]:
        return {**self.tags, **more}

    def recorded(self, record: QueryRecord) -> None:
        if record.query_id not in self.wanted:
            return
        m = self.metrics
        m["queries"].inc(1, self._tagged(status=record.status))
        for kind, count in record.usage.model_dump().items():
            if count and kind in Usage.model_fields:
                m["tokens"].inc(count, self._tagged(kind=kind.removesuffix("_tokens")))
        if self.price is not None and (cost := self.price.cost(record.usage)) > 0:
            m["cost"].inc(cost, self.tags)
        retries = Tally(retry_class(r) for turn in record.trajectory for r in turn.retries)
        for kind, n in retries.items():
            m["retries"].inc(n, self._tagged(**{"class": kind}))
        for turn in record.trajectory:
            m["model_seconds"].observe(turn.model_seconds, self.tags)
            m["waited_seconds"].observe(turn.waited_seconds, self.tags)
            for call in turn.tool_calls:
                m["tool_seconds"].observe(call.seconds, self._tagged(tool=call.name or "?"))

    def judged(self, judgement: Judgement) -> None:
        if judgement.query_id not in self.wanted or judgement.judge_model != self.judge:
            return
        verdict = (
            "failed"
            if judgement.status != "judged"
            else ("correct" if judgement.correct else "wrong")
        )
        self.metrics["verdicts"].inc(1, self._tagged(verdict=verdict))

    def live(self, running: int, waiting: int, replicas: dict[str, int]) -> None:
        m = self.metrics
        m["running"].set(running, self.tags)
        m["waiting"].set(waiting, self.tags)
        for node in self._nodes - set(replicas):  # a node whose replicas are gone
            m["replicas"].set(0, self._tagged(node=node))
        for node, count in replicas.items():
            m["replicas"].set(count, self._tagged(node=node))
        self._nodes |= set(replicas)
