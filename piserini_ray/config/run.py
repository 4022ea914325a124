"""`RunConfig`, the whole configuration of a run, its `run` (epochs) section, and its identity:
the config hash that names a run directory, data files counted by content."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field, model_validator

from piserini_ray.config.agent import AgentConfig, ToolsConfig
from piserini_ray.config.base import StrictModel, identity_data
from piserini_ray.config.benchmark import BenchmarkConfig, SliceConfig
from piserini_ray.config.hashing import file_identity
from piserini_ray.config.judging import DEFAULT_JUDGE, OFFLINE_JUDGE, JudgeConfig, PricingConfig
from piserini_ray.config.model import ModelConfig, RetryConfig
from piserini_ray.config.offline import OfflineConfig
from piserini_ray.config.retrieval import RetrievalConfig
from piserini_ray.config.runtime import RuntimeConfig

#: Data files enter a run's identity by content, never by path: a checkout copied elsewhere
#: (a Ray job's working dir, another node) names the same run.
_DATA_KEYS = (
    ("benchmark", "queries"),
    ("benchmark", "corpus"),
    ("benchmark", "qrels_evidence"),
    ("benchmark", "qrels_gold"),
    ("slice", "ids_file"),
)


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
    """The whole configuration of a run: every section of a run config file, validated
    (unknown keys refused). Frozen: change it with `model_copy(update=...)`, or load it again
    with overrides. Every key is on the configuration reference page.

    Args:
        **sections: the sections (`benchmark`, `slice`, `retrieval`, `model`, `agent`,
            `tools`, `judge`, `pricing`, `runtime`, ...); each missing one takes its defaults.

    Returns:
        A validated config; `config_hash()` is the identity of the run it configures.

    Example:
        ```python
        from piserini_ray import RunConfig, load_config

        config = load_config(overrides={"slice.sample": 3})
        assert isinstance(config, RunConfig) and config.slice.sample == 3
        print(config.config_hash()[:8])
        ```
    """

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
    #: The loopback provider started for offline models (latency, quotas, aliases, seed).
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

    @model_validator(mode="after")
    def _served_judges_run_one_server(self) -> RunConfig:
        for judge in (self.judge.model, *self.judge.models):
            if judge is not None and judge.serve is not None and judge.serve.replicas != 1:
                raise ValueError(
                    f"judge {judge.name!r}: serve.replicas is {judge.serve.replicas}, but a "
                    "served judge runs one server (its calls are single turns, sent from the "
                    "driver): set serve.replicas: 1 and raise judge.concurrency instead"
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

    def judge_panel(self) -> list[ModelConfig]:
        """The run's judges, each once by name: the primary (`judge_model`) first, then the
        rest of a panel (`judge.models`)."""
        judges = {m.name: m for m in (self.judge_model(), *self.judge.models)}
        return list(judges.values())

    def judged_by(self, model: ModelConfig) -> RunConfig:
        """This config with `model` as its one judge: how each judge of a panel judges."""
        one = self.judge.model_copy(update={"model": model, "models": []})
        return self.model_copy(update={"judge": one})

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
