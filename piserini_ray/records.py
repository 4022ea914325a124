"""Record schemas of a run (docs/spec.md §5, §6): what the agent, the judge and the reports
exchange and what the run directory holds. Pydantic only, so that every layer can import them
cheaply (no litellm, no Ray, no pyserini)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field


class Usage(BaseModel):
    """Tokens of one model call, one turn or a whole query (summed)."""

    #: Input tokens, cached ones included (uncached input = input - cached).
    input_tokens: int = 0
    #: Output tokens, reasoning tokens included.
    output_tokens: int = 0
    #: Input tokens served from the provider's prompt cache (billed at the cache-read price).
    cached_tokens: int = 0
    #: Input tokens written to the cache, where a provider bills that separately (Anthropic).
    cache_write_tokens: int = 0
    #: The part of `cache_write_tokens` written to Anthropic's 1-hour cache (`ttl: 1h`, what
    #: a batch marks), billed at its own, higher price (`Price.cache_write_1h`).
    cache_write_1h_tokens: int = 0
    #: Output tokens spent on hidden reasoning, where reported (already inside output_tokens).
    reasoning_tokens: int = 0
    #: Input tokens no provider reported: the prompts of calls cut at the budget or failed
    #: after they were sent, counted locally (`Turn.estimate_method` says how). Already inside
    #: `input_tokens` and priced as uncached input, so every cost counts them; this says how
    #: much of the input (and of the cost) is an estimate.
    estimated_input_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f: getattr(self, f) + getattr(other, f) for f in Usage.model_fields})


Status = Literal["completed", "timeout", "failed"]


class ToolCallRecord(BaseModel):
    """One tool call of a turn: what the model asked and what it saw."""

    id: str | None  # the provider's id of the call, when it gave one
    name: str  # search, read_search_results or read_document (or what the model named)
    arguments: str  # as the model sent it (may be invalid JSON: that is part of the record)
    reason: str | None = None  # the call's `reason` argument (its rationale)
    ok: bool  # False: a tool error, returned to the agent as its observation
    observation: str  # what the agent saw (truncated when spilled)
    #: The spill file holding the whole output when it was truncated (`spill/<query id>/`).
    spill_file: str | None = None
    error: str | None = None  # the tool error, when `ok` is False
    seconds: float  # the tool's time, charged to the budget
    #: When the tool call began (Unix seconds; None in records before it was kept).
    started_at: float | None = None
    #: The documents the call showed (a search's page of hits) or opened (read_document).
    docids: list[str] = Field(default_factory=list)


class Turn(BaseModel):
    """One model turn of a query's trajectory: the model's output and the tool calls it made."""

    index: int  # 1 for the first turn
    model_output: str | None  # the model's text of the turn (None: tool calls only)
    #: The model's reasoning text or summary, when its provider returns one (thinking blocks,
    #: `reasoning_content`).
    reasoning: str | None = None
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)  # in the order made
    usage: Usage = Usage()  # the turn's model call's tokens
    model_seconds: float = 0.0  # the model call's time, charged to the budget
    waited_seconds: float = 0.0  # time waiting on limiters and in back-off (not charged)
    attempts: int = 1  # calls sent for this turn (retries included)
    retries: list[str] = Field(default_factory=list)  # why each failed attempt failed
    usage_reported: bool = True  # False: no usage came back (no usage block, or no reply)
    #: The call was cut at the budget or failed after it was sent: no usage came back, but the
    #: provider received the request (and may bill it), so `usage` holds its prompt, counted
    #: locally (`usage.estimated_input_tokens`); what it may have generated stays unknown.
    usage_estimated: bool = False
    #: How the estimated prompt was counted (`llm.usage.estimate_prompt`): `tokenizer <name>`
    #: (litellm's tokenizer of the model) or `characters / 4`, calibrated by the provider's
    #: last reported count (that count plus what was added, or its ratio).
    estimate_method: str | None = None
    started_at_charged: float = 0.0  # the budget's charged seconds when the turn began
    #: When the turn's model call began (Unix seconds; None in records before it was kept).
    started_at: float | None = None
    #: Why the model's reply ended, as the provider said (`stop`, `tool_calls`, `length`, ...);
    #: None for a call without a reply.
    finish_reason: str | None = None
    steered: bool = False  # the steer message was added before this turn


class RankingLog(BaseModel):
    """One search of a query: its text and the whole cached ranking (for depth curves, TREC
    exports and where-the-evidence-sits analyses)."""

    search_id: str  # the session's id of the search (s1, s2, ...)
    query: str  # the query as the agent wrote it
    docids: list[str]  # the whole ranking, best first, at the configured depth
    #: Which `retrieval.backend` ranked them (records before backends existed: BM25).
    backend: str = "bm25"


#: What a record imported from another harness's run file may lack (`piserini-ray import`),
#: one word per part: `usage` (tokens, so cost), the `previewed`, `opened` and `behavior`
#: document sets, the `trajectory` (turns, their calls and timings), the search `rankings`
#: (depth curves), `timing` (the budget clock: charged and waited seconds) and `wall`
#: (wall-clock seconds). The report shows what depends on a missing part as n/a, never 0.
Unavailable = Literal[
    "usage", "previewed", "opened", "behavior", "trajectory", "rankings", "timing", "wall"
]
UNAVAILABLE: tuple[Unavailable, ...] = get_args(Unavailable)


class ImportedFrom(BaseModel):
    """Where an imported record came from, and which of its parts that format does not hold
    (their fields in the record are empty or zero, and mean nothing)."""

    format: str  # browsecomp-plus | pi-serini
    directory: str  # the folder the run files were read from (absolute)
    file: str  # this record's file in that folder
    #: The parts of the record the format lacks (`Unavailable`): reported as n/a, never 0.
    unavailable: list[Unavailable] = Field(default_factory=list)


class QueryRecord(BaseModel):
    """One query's run: a line of the run directory's `records.jsonl`, written once when the
    agent's loop ends (its answer, trajectory, document sets, tokens and clocks). Every field
    is on the record files' reference page.

    Args:
        **fields: the record's fields (the agent's loop and the store make records; a reader
            gets them from `records.jsonl`).

    Returns:
        A validated record.

    Example:
        ```python
        from pathlib import Path

        from piserini_ray import QueryRecord

        lines = (Path(run_dir) / "records.jsonl").read_text().splitlines()
        records = [QueryRecord.model_validate_json(line) for line in lines]
        print(records[0].exact_answer, records[0].status, records[0].usage.input_tokens)
        ```
    """

    run_id: str  # the run's id (its manifest's)
    config_hash: str  # the hash of the run config's identity (`RunConfig.config_hash`)
    query_id: str  # the query's id in the benchmark
    #: Which epoch of the run answered (`run.epochs`): a run's records are keyed by query and
    #: epoch, each epoch in its own directory.
    epoch: int = 1
    #: The agent model's name (`model.name`).
    model: str
    #: `completed` (an answer), `timeout` (the budget ran out first) or `failed` (an error).
    status: Status
    #: What failed, for a failed query (its last attempt's error).
    error: str | None = None
    termination: str | None = None  # why the loop ended: answer, budget, iterations, error
    #: A failure that was not the query's fault (its node or replica was lost, the provider
    #: stayed down through every retry): `resume` runs it again.
    retryable: bool = False
    #: The model's final message, whole; its parsed parts follow.
    final_answer: str | None = None
    #: The `Explanation:` part of the final message.
    explanation: str | None = None
    #: The `Exact Answer:` part: what the judge compares with the gold answer.
    exact_answer: str | None = None
    #: The `Confidence:` part, 0 to 100 (100 when missing, as the calibration error takes it).
    confidence: float = 100.0
    #: True when the final message gave no confidence.
    confidence_missing: bool = True
    #: The `[docid]` references of the final answer that exist in the corpus.
    cited: list[str] = Field(default_factory=list)
    #: Every model turn with its tool calls and their observations (left out by readers that
    #: do not ask for it).
    trajectory: list[Turn] = Field(default_factory=list)
    #: Model turns taken: the trajectory's length, kept when a reader leaves the trajectory out.
    turns: int | None = None
    #: Tool calls by tool name.
    tool_call_counts: dict[str, int] = Field(default_factory=dict)
    #: The agent's tokens over every turn.
    usage: Usage = Usage()
    #: Seconds charged to the query's budget (its own work: model and tool time).
    charged_seconds: float = 0.0
    #: Seconds spent waiting for a shared resource (rate limiters, quotas), not charged.
    waited_seconds: float = 0.0
    #: Wall-clock seconds from the query's start to its record.
    wall_seconds: float = 0.0
    #: Which clock the budget counted (`working`: charged seconds only).
    budget_clock: str = "working"
    #: True when the steer message (submit now) was sent.
    steered: bool = False
    #: Every docid of every cached ranking of every search (the whole depth, not only the
    #: hits shown).
    surfaced: list[str] = Field(default_factory=list)
    #: Docids whose hit was shown on a page (a search's first page or a browsed page).
    previewed: list[str] = Field(default_factory=list)
    #: Docids read with `read_document`.
    opened: list[str] = Field(default_factory=list)
    #: The opened docids and the cited ones (opened ∪ cited).
    behavior: list[str] = Field(default_factory=list)
    started_at: str  # when the query started (ISO 8601, UTC)
    finished_at: str  # when its loop ended (ISO 8601, UTC)
    #: Model calls whose reply carried no usage block: their tokens are unknown, so the
    #: record's usage (and any cost) is a lower bound.
    calls_without_usage: int = 0
    #: Model calls cut at the budget or failed after they were sent, whose prompt tokens are
    #: estimated in `usage` (`usage.estimated_input_tokens`; `Turn.usage_estimated`).
    calls_usage_estimated: int = 0
    #: Every search's whole ranking (`store.records()` leaves them out unless asked).
    rankings: list[RankingLog] = Field(default_factory=list)
    #: Full texts of truncated tool outputs by spill file name; the store writes them to
    #: `spill/<query_id>/` and keeps them out of `records.jsonl`.
    spills: dict[str, str] = Field(default_factory=dict)
    #: Set on a record made by `piserini-ray import` from another harness's run file.
    imported: ImportedFrom | None = None

    def has(self, part: str) -> bool:
        """Whether this record holds `part` (`UNAVAILABLE`; a record of our own holds all)."""
        return self.imported is None or part not in self.imported.unavailable


class Judgement(BaseModel):
    """One judge model's verdict on one query (docs/spec.md §6), written once per (query, judge): a
    line of the run directory's `judgements/<judge model>.jsonl`.

    Args:
        **fields: the verdict's fields (the judge makes them; a reader gets them from the
            judgements file).

    Returns:
        A validated verdict.

    Example:
        ```python
        from pathlib import Path

        from piserini_ray import Judgement

        path = Path(run_dir) / "judgements" / "offline_judge.jsonl"
        verdicts = [Judgement.model_validate_json(l) for l in path.read_text().splitlines()]
        print(sum(bool(v.correct) for v in verdicts), "correct")
        ```
    """

    query_id: str  # the query judged
    #: The judge model's name.
    judge_model: str
    #: `judged` (a verdict) or `judge_failed` (the judge's calls failed; `error` says why).
    status: Literal["judged", "judge_failed"]
    #: The verdict: True when the exact answer matches the gold answer.
    correct: bool | None = None
    #: The judge's confidence (see `template`).
    confidence: float | None = None
    #: The answer the judge read from the response.
    extracted_final_answer: str | None = None
    #: The gold answer it was compared with.
    correct_answer: str | None = None
    #: The judge's reasoning, as it wrote it.
    reasoning: str | None = None
    error: str | None = None  # why the judge failed, for `judge_failed`
    #: Calls made to reach the verdict (retries included).
    attempts: int = 0
    #: The judge's tokens for this verdict.
    usage: Usage = Usage()
    #: The prompt the judge read (`judge.template`): under `browsecomp-plus` its `confidence`
    #: is the one it extracted from the response, not its confidence in the verdict.
    template: Literal["piserini", "browsecomp-plus"] = "piserini"


class ServedTime(BaseModel):
    """A line of `served.jsonl`: the server-seconds of a model the run serves
    (`model.serve`) charged to this run by one execution, its share where the servers served
    several runs at once (by their tokens). The run's cost adds seconds / 3600 x the price."""

    model: str  # the served model's name
    engine: str  # `serve.engine`
    #: What the served model did for the run: its agent (the run's cost) or its judge (the
    #: judge's cost, beside the run's).
    role: Literal["agent", "judge"] = "agent"
    replicas: int  # servers that were up
    #: This run's server-seconds (replicas x the seconds they were up, times its share).
    seconds: float = Field(ge=0)
    price_per_replica_hour: float = Field(ge=0)
    at: str = Field(default_factory=lambda: now_iso())  # when the execution ended

    @property
    def cost_usd(self) -> float:
        return self.seconds / 3600 * self.price_per_replica_hour


class RunManifest(BaseModel):
    """A run directory's `manifest.json`, written when the run directory is created: the
    config it runs (so `resume`, `judge` and `report` need only the directory), the versions
    of what ran it, and the content keys of its data files.

    Args:
        **fields: the manifest's fields (the store writes it; a reader gets it from the file).

    Returns:
        A validated manifest; `RunConfig.model_validate(manifest.config)` is the run's config.

    Example:
        ```python
        from pathlib import Path

        from piserini_ray import RunManifest

        manifest = RunManifest.model_validate_json((Path(run_dir) / "manifest.json").read_text())
        print(manifest.config_hash, manifest.versions["piserini_ray"])
        ```
    """

    run_id: str  # the run directory's name, a dash and the config hash's first 8 characters
    #: The hash of the config's identity (what makes two runs the same run).
    config_hash: str
    #: The whole config, as `RunConfig.model_dump(mode="json")` gives it.
    config: dict[str, Any]
    #: Versions of Python, the package and the libraries that ran the run.
    versions: dict[str, str]
    #: When the run directory was created (ISO 8601, UTC).
    started_at: str
    #: The content key of each data file when the run began (`RunConfig.data_keys`): a
    #: resumed run whose files changed in place is refused, never mixed.
    data: dict[str, str] = Field(default_factory=dict)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
