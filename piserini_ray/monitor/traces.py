"""OpenTelemetry traces of a run's queries, with the GenAI semantic conventions, sent over
OTLP/HTTP to whatever collects them (Phoenix, Langfuse, Jaeger, MLflow, an OTel collector).

Off unless an endpoint is named (`monitor/otlp.py`: `runtime.traces_endpoint`, or the standard
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`): then the pipeline imports
this module and the run pays for nothing else. Each query is one trace, made on the driver from
its record once the store has written it (`TraceExporter` is a store listener, like the status
board), so a query whose replica ran on another node is one trace all the same, and a trace
holds exactly what the record holds:

- `invoke_agent piserini` (the query): its status, termination, verdict, tokens and cost;
- `chat {model}` per model call: `gen_ai.usage.input_tokens`, `output_tokens`,
  `cache_read.input_tokens`, `cache_creation.input_tokens`, the provider and the reply's
  finish reason, its retries;
- `execute_tool {name}` per tool call: the documents it showed or opened.

A span waits for its query's verdict (judged as the answers come, on Ray) and goes out with it;
what has none when the execution ends goes out without. Every attribute passes the one
scrubber (`llm/scrubber.py`); no prompt, answer or tool output is sent. A collector that is down
costs the run nothing: spans go out from a thread of their own, and the first batch it refuses
is said once ("traces are dropped").
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode

from piserini_ray.config import RunConfig
from piserini_ray.llm.scrubber import scrubber
from piserini_ray.metrics.cost import Price
from piserini_ray.records import Judgement, QueryRecord, Turn, Usage

Log = Callable[[str], None]
AGENT_NAME = "piserini"
#: How long one export may take before the spans are counted as dropped (the run never waits
#: on it: spans go out from the exporter's own thread, and at the end at most this long).
EXPORT_SECONDS = 5.0
#: The OTLP exporter logs every retry and refusal ("Transient error ..."): a line a second
#: while a collector is down. `_SaysOnce` says it once instead.
logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)


class _SaysOnce(SpanExporter):
    """The OTLP exporter, saying once when the collector does not take the spans."""

    def __init__(self, inner: SpanExporter, endpoint: str, log: Log) -> None:
        self.inner, self.endpoint, self.log = inner, endpoint, log
        self.refused = 0
        #: The last export was refused: the collector is down, as far as we know.
        self.failing = False
        #: Set at the end while the collector is down: what is left is dropped at once, so
        #: the run does not wait out the exporter's retries.
        self.dropping = False
        self._shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.dropping:
            self.refused += len(spans)
            return SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
        except Exception:  # the exporter's own failure is a refusal too
            result = SpanExportResult.FAILURE
        self.failing = result != SpanExportResult.SUCCESS
        if self.failing:
            if not self.refused:
                self.log(
                    f"warning: the trace collector at {self.endpoint} did not take {len(spans)} "
                    "spans (is it up?); traces are dropped while it refuses, the run goes on"
                )
            self.refused += len(spans)
        return result

    def stop_retrying(self) -> None:
        """The collector is down at the end: an export waiting out its back-off gives up now
        (the OTLP exporter's shutdown ends that wait), and what is left is dropped at once."""
        self.dropping = True
        self.shutdown()

    def shutdown(self) -> None:
        if not self._shut:
            self._shut = True
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _iso_seconds(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _attributes(values: dict[str, Any], scrub: Callable[[str], str]) -> dict[str, Any]:
    """Attributes as OTel takes them: no None, text scrubbed, lists of text."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            value = scrub(value)
        elif isinstance(value, list | tuple):
            value = [scrub(str(v)) for v in value]
        out[key] = value
    return out


def _usage_attributes(usage: Usage) -> dict[str, int]:
    """The GenAI conventions' token counts of a query or a call."""
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
    }


class TraceExporter:
    """One run's traces: a store listener that sends each query as a trace (`close` sends
    what still waits for a verdict and flushes)."""

    def __init__(
        self,
        run_dir_name: str,
        config: RunConfig,
        price: Price | None,
        wanted: set[str],
        endpoint: str,
        log: Log,
    ) -> None:
        self.run = run_dir_name
        self.model = config.model.name
        litellm_model = config.model.resolved_litellm_model()
        self.provider = litellm_model.split("/", 1)[0] if "/" in litellm_model else "openai"
        self.judge = config.judge_model().name
        self.price = price
        self.wanted = wanted
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._waiting: dict[str, QueryRecord] = {}
        #: The last flush, started by `close` (`flushed` waits for it).
        self._flushing: threading.Thread | None = None
        self.exporter = _SaysOnce(
            OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_SECONDS), endpoint, log
        )
        self.provider_sdk = TracerProvider(
            resource=Resource.create({"service.name": "piserini-ray", "piserini.run": self.run})
        )
        self.provider_sdk.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider_sdk.get_tracer("piserini_ray")
        log(f"traces of {run_dir_name} go to {endpoint} (OTLP/HTTP, GenAI conventions)")

    # ------------------------------------------------------------------ the store's events

    def recorded(self, record: QueryRecord) -> None:
        if record.query_id in self.wanted:
            with self._lock:
                self._waiting[record.query_id] = record

    def judged(self, judgement: Judgement) -> None:
        if judgement.judge_model != self.judge:
            return
        with self._lock:
            record = self._waiting.pop(judgement.query_id, None)
        if record is not None:
            self._send(record, judgement)

    def close(self) -> None:
        """Send what still waits for a verdict, and flush on a thread of its own while the
        driver judges and reports (the process waits for it at exit, `EXPORT_SECONDS` at
        most). A collector that refused the last batch is not waited for again."""
        with self._lock:
            left, self._waiting = list(self._waiting.values()), {}
        for record in left:
            self._send(record, None)
        if self.exporter.failing:
            self.exporter.stop_retrying()

        def flush() -> None:
            self.provider_sdk.force_flush(int(EXPORT_SECONDS * 1000))
            self.provider_sdk.shutdown()

        self._flushing = threading.Thread(target=flush, name="traces-flush", daemon=True)
        self._flushing.start()
        atexit.register(self._flushing.join, EXPORT_SECONDS * 2)

    def flushed(self, timeout: float = EXPORT_SECONDS * 2) -> bool:
        """Wait for the flush `close` started; whether it ended within `timeout`."""
        if self._flushing is None:
            return False
        self._flushing.join(timeout)
        return not self._flushing.is_alive()

    # ------------------------------------------------------------------ spans

    def _span(
        self,
        name: str,
        kind: SpanKind,
        start: float,
        attributes: dict[str, Any],
        scrub: Callable[[str], str],
        context: Any = None,
    ) -> Any:
        """A span begun at `start` (seconds since the epoch) with its attributes scrubbed."""
        return self.tracer.start_span(
            name,
            context=context,
            kind=kind,
            start_time=_ns(start),
            attributes=_attributes(attributes, scrub),
        )

    def _send(self, record: QueryRecord, verdict: Judgement | None) -> None:
        scrub = scrubber()  # the secrets read once for the query's thousand attributes
        started = _iso_seconds(record.started_at)
        finished = _iso_seconds(record.finished_at)
        usage = record.usage
        judged = None
        if verdict is not None:
            judged = (
                "judge_failed"
                if verdict.status != "judged"
                else ("correct" if verdict.correct else "wrong")
            )
        root = self._span(
            f"invoke_agent {AGENT_NAME}",
            SpanKind.INTERNAL,
            started,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": AGENT_NAME,
                "gen_ai.provider.name": self.provider,
                "gen_ai.request.model": self.model,
                "gen_ai.conversation.id": f"{self.run}/{record.query_id}",
                **_usage_attributes(usage),
                "piserini.run": self.run,
                "piserini.query_id": record.query_id,
                "piserini.status": record.status,
                "piserini.termination": record.termination,
                "piserini.verdict": judged or "not judged",
                "piserini.judge_model": self.judge if verdict is not None else None,
                "piserini.cost_usd": None if self.price is None else self.price.cost(usage),
                "piserini.turns": len(record.trajectory),
                "piserini.exact_answer_given": record.exact_answer is not None,
                "error.type": "query_failed" if record.status == "failed" else None,
            },
            scrub,
        )
        if record.status == "failed":
            root.set_status(Status(StatusCode.ERROR, scrub(record.error or "failed")[:500]))
        context = trace.set_span_in_context(root)
        clock = started
        for turn in record.trajectory:
            clock = self._turn(turn, started, clock, context, scrub)
        root.end(end_time=_ns(max(finished, clock)))

    def _turn(
        self,
        turn: Turn,
        query_start: float,
        clock: float,
        context: Any,
        scrub: Callable[[str], str],
    ) -> float:
        """The turn's `chat` span and its tools' spans; returns where the turn ended."""
        began = (
            turn.started_at
            if turn.started_at is not None
            else max(clock, query_start + turn.started_at_charged)
        )
        ended = began + turn.waited_seconds + turn.model_seconds
        usage = turn.usage
        chat = self._span(
            f"chat {self.model}",
            SpanKind.CLIENT,
            began,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self.provider,
                "gen_ai.request.model": self.model,
                **_usage_attributes(usage),
                "gen_ai.response.finish_reasons": [turn.finish_reason]
                if turn.finish_reason
                else None,
                "piserini.turn": turn.index,
                "piserini.attempts": turn.attempts,
                "piserini.retries": turn.retries or None,
                "piserini.waited_seconds": turn.waited_seconds,
                "piserini.usage_estimated": turn.usage_estimated,
                "piserini.steered": turn.steered,
            },
            scrub,
            context,
        )
        if turn.model_output is None and not turn.tool_calls and turn.usage_estimated:
            chat.set_status(Status(StatusCode.ERROR, "the call was cut or failed after sending"))
        chat.end(end_time=_ns(ended))
        for call in turn.tool_calls:
            start = call.started_at if call.started_at is not None else ended
            tool = self._span(
                f"execute_tool {call.name}",
                SpanKind.INTERNAL,
                start,
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.name,
                    "gen_ai.tool.type": "function",
                    "gen_ai.tool.call.id": call.id,
                    "piserini.docids": call.docids or None,
                    "piserini.spill_file": call.spill_file,
                    "piserini.turn": turn.index,
                },
                scrub,
                context,
            )
            if not call.ok:
                tool.set_status(Status(StatusCode.ERROR, scrub(call.error or "tool error")[:500]))
            tool.end(end_time=_ns(start + call.seconds))
            ended = max(ended, start + call.seconds)
        return ended
