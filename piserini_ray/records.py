"""Record schemas of a run (SPEC §5, §6): what the agent, the judge and the reports exchange and
what the run directory holds. Pydantic only, so that every layer can import them cheaply (no
litellm, no Ray, no pyserini)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field


class Usage(BaseModel):
    input_tokens: int = 0
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
    id: str | None
    name: str
    arguments: str  # as the model sent it (may be invalid JSON: that is part of the record)
    reason: str | None = None
    ok: bool
    observation: str  # what the agent saw (truncated when spilled)
    spill_file: str | None = None
    error: str | None = None
    seconds: float


class Turn(BaseModel):
    index: int
    model_output: str | None
    #: The model's reasoning text or summary, when its provider returns one (thinking blocks,
    #: `reasoning_content`).
    reasoning: str | None = None
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    usage: Usage = Usage()
    model_seconds: float = 0.0
    waited_seconds: float = 0.0
    attempts: int = 1
    retries: list[str] = Field(default_factory=list)
    usage_reported: bool = True  # False: no usage came back (no usage block, or no reply)
    #: The call was cut at the budget or failed after it was sent: no usage came back, but the
    #: provider received the request (and may bill it), so `usage` holds its prompt, counted
    #: locally (`usage.estimated_input_tokens`); what it may have generated stays unknown.
    usage_estimated: bool = False
    #: How the estimated prompt was counted (`llm.usage.estimate_prompt`): `tokenizer <name>`
    #: (litellm's tokenizer of the model) or `characters / 4`, calibrated by the provider's
    #: last reported count (that count plus what was added, or its ratio).
    estimate_method: str | None = None
    started_at_charged: float = 0.0
    steered: bool = False  # the steer message was added before this turn


class RankingLog(BaseModel):
    """One search of a query: its text and the whole cached ranking (for depth curves, TREC
    exports and where-the-evidence-sits analyses)."""

    search_id: str
    query: str
    docids: list[str]
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
    #: The folder the run files were read from (absolute), and this record's file in it.
    directory: str
    file: str
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

    #: The run's id (its directory's name) and the hash of its config's identity.
    run_id: str
    config_hash: str
    query_id: str
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
    #: The docids the final message cites (`[docid]`).
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
    #: The document sets: every docid a search returned (surfaced), showed with a preview
    #: (previewed), read whole (opened), and the behavior set (previewed or opened).
    surfaced: list[str] = Field(default_factory=list)
    previewed: list[str] = Field(default_factory=list)
    opened: list[str] = Field(default_factory=list)
    behavior: list[str] = Field(default_factory=list)
    #: When the query started and ended (ISO 8601, UTC).
    started_at: str
    finished_at: str
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
    """One judge model's verdict on one query (SPEC §6), written once per (query, judge): a
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

    query_id: str
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
    error: str | None = None
    #: Calls made to reach the verdict (retries included).
    attempts: int = 0
    #: The judge's tokens for this verdict.
    usage: Usage = Usage()
    #: The prompt the judge read (`judge.template`): under `browsecomp-plus` its `confidence`
    #: is the one it extracted from the response, not its confidence in the verdict.
    template: Literal["piserini", "browsecomp-plus"] = "piserini"


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

    run_id: str
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
