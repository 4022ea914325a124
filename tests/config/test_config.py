from pathlib import Path

import pytest

from piserini_ray.config import BM25Params, RunConfig, load_config
from piserini_ray.errors import ConfigError


def test_defaults_are_the_papers_settings() -> None:
    cfg = RunConfig()
    assert cfg.retrieval.bm25 == BM25Params(k1=25.0, b=1.0)
    assert cfg.retrieval.depth == 1000
    assert cfg.retrieval.jvm_heap == "1g"
    assert cfg.benchmark.source == "sample"
    assert (cfg.tools.first_page, cfg.tools.browse_offset, cfg.tools.browse_limit) == (5, 6, 10)
    assert (cfg.tools.doc_offset, cfg.tools.doc_limit, cfg.tools.cache_size) == (1, 200, 32)


def test_preset_sets_bm25() -> None:
    cfg = load_config(None, {"retrieval.preset": "pyserini-default"})
    assert cfg.retrieval.bm25 == BM25Params(k1=0.9, b=0.4)


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="pyserini-default"):
        load_config(None, {"retrieval.preset": "bogus"})


def test_unknown_key_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("retrieval:\n  detph: 10\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*detph"):
        load_config(path)


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("benchmark:\n  source: jsonl\n  queries: q.jsonl\n  corpus: /abs/c.jsonl\n")
    cfg = load_config(path)
    assert cfg.benchmark.queries == tmp_path / "q.jsonl"
    assert cfg.benchmark.corpus == Path("/abs/c.jsonl")


def test_browsecomp_plus_requires_the_canary_when_obfuscated() -> None:
    over = {"benchmark.source": "browsecomp-plus", "benchmark.queries": "q.parquet"}
    over["benchmark.corpus"] = "c.parquet"
    with pytest.raises(ConfigError, match=r"benchmark\.canary is required"):
        load_config(None, over)
    assert load_config(None, over | {"benchmark.obfuscated": False}).benchmark.canary is None


def test_jsonl_source_names_missing_paths() -> None:
    with pytest.raises(ConfigError, match=r"benchmark\.queries and benchmark\.corpus"):
        load_config(None, {"benchmark.source": "jsonl"})


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_bad_heap_value() -> None:
    with pytest.raises(ConfigError, match="jvm_heap"):
        load_config(None, {"retrieval.jvm_heap": "lots"})


def _checkout(root: Path, comment: str = "") -> Path:
    """A config and its data files laid out as in a checkout under `root`."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "queries.jsonl").write_text('{"query_id": "1", "query": "q", "answer": "a"}\n')
    (root / "data" / "corpus.jsonl").write_text('{"docid": "d1", "text": "hello"}\n')
    (root / "configs").mkdir()
    path = root / "configs" / "mine.yaml"
    path.write_text(
        f"{comment}\nbenchmark:\n  source: jsonl\n  queries: ../data/queries.jsonl\n"
        "  corpus: ../data/corpus.jsonl\nretrieval:\n  index_root: ../indexes\n"
    )
    return path


def test_a_checkout_copied_elsewhere_names_the_same_run(tmp_path: Path) -> None:
    """A Ray job runs from a fresh copy of the working dir at a new path each time: data files
    count by content, where indexes live not at all, and comments are not config."""
    here = load_config(_checkout(tmp_path / "here"))
    there = load_config(_checkout(tmp_path / "ray_pkg_0123", comment="# edited comment"))
    assert here.benchmark.queries != there.benchmark.queries  # absolute, different places
    assert here.config_hash() == there.config_hash()
    (tmp_path / "ray_pkg_0123" / "data" / "corpus.jsonl").write_text(
        '{"docid": "d1", "text": "changed"}\n'
    )
    assert load_config(tmp_path / "ray_pkg_0123" / "configs" / "mine.yaml").config_hash() != (
        here.config_hash()
    )


def test_a_large_data_file_is_identified_by_sampled_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the whole-file limit the identity reads 16 chunks (head and tail included), so a
    change in the last byte still counts and naming a run never reads gigabytes."""
    import piserini_ray.config.hashing as config_module

    monkeypatch.setattr(config_module, "_WHOLE_FILE_LIMIT", 1 << 20)
    monkeypatch.setattr(config_module, "_BLOCK", 1 << 12)
    big = tmp_path / "corpus.jsonl"
    big.write_bytes(b"x" * (3 << 20))
    first = config_module.file_identity(big)
    assert first.startswith(f"{3 << 20}:")
    with open(big, "r+b") as f:
        f.seek((3 << 20) - 1)
        f.write(b"y")
    assert config_module.file_identity(big) != first
    assert config_module.file_identity(tmp_path / "absent") == f"missing:{tmp_path / 'absent'}"


def test_a_small_data_file_is_named_by_the_hash_an_index_list_holds(tmp_path: Path) -> None:
    """One file hasher: a run's identity and an index's file list (`retrieval/index_files.py`)
    agree on a file's SHA-256, and a rewrite renames it."""
    import hashlib

    from piserini_ray.config.hashing import file_identity, sha256_of
    from piserini_ray.retrieval.index_files import index_files

    data = tmp_path / "index" / "_0.cfs"
    data.parent.mkdir()
    data.write_bytes(b"postings")
    assert file_identity(data) == sha256_of(data) == hashlib.sha256(b"postings").hexdigest()
    assert index_files(data.parent).files[0].sha256 == sha256_of(data)
    data.write_bytes(b"postings, rewritten")
    assert file_identity(data) == hashlib.sha256(b"postings, rewritten").hexdigest()


# Every config field and whether it names a run (its config hash). Adding a field to a model
# fails its class definition until it is listed in IDENTITY or NOT_IDENTITY there; this list
# makes the decision visible in review. `offline.*` counts only for a model that the run's own
# offline provider serves; `retrieval.dense/hybrid/rerank.*` only for the backends that use them.
RUN_IDENTITY = [
    "benchmark",
    "benchmark.source",
    "benchmark.name",
    "benchmark.queries",
    "benchmark.corpus",
    "benchmark.qrels_evidence",
    "benchmark.qrels_gold",
    "benchmark.obfuscated",
    "benchmark.canary",
    "slice",
    "slice.ids",
    "slice.ids_file",
    "slice.sample",
    "slice.seed",
    "retrieval",
    "retrieval.backend",
    "retrieval.preset",
    "retrieval.bm25",
    "retrieval.bm25.k1",
    "retrieval.bm25.b",
    "retrieval.depth",
    "retrieval.jvm_heap",
    "retrieval.index_threads",
    "retrieval.dense",
    "retrieval.dense.encoder",
    "retrieval.dense.pooling",
    "retrieval.dense.normalize",
    "retrieval.dense.query_prefix",
    "retrieval.dense.doc_prefix",
    "retrieval.dense.query_max_length",
    "retrieval.dense.doc_max_length",
    "retrieval.dense.prebuilt_index",
    "retrieval.hybrid",
    "retrieval.hybrid.fusion",
    "retrieval.hybrid.rrf_k",
    "retrieval.hybrid.alpha",
    "retrieval.hybrid.fusion_depth",
    "retrieval.rerank",
    "retrieval.rerank.alpha",
    "tools",
    "tools.first_page",
    "tools.browse_offset",
    "tools.browse_limit",
    "tools.max_browse_limit",
    "tools.doc_offset",
    "tools.doc_limit",
    "tools.max_doc_limit",
    "tools.cache_size",
    "tools.excerpt_ranks",
    "tools.excerpt_chars",
    "tools.excerpt_lead",
    "tools.spill_max_lines",
    "tools.spill_max_bytes",
    "tools.reason_max_words",
    "model",
    "model.name",
    "model.litellm_model",
    "model.api_base",
    "model.api_key_env",
    "model.temperature",
    "model.max_output_tokens",
    "model.reasoning_effort",
    "model.call_timeout",
    "model.extra",
    "retry",
    "retry.max_attempts",
    "retry.max_elapsed",
    "retry.backoff_base",
    "retry.backoff_cap",
    "retry.max_retry_after",
    "agent",
    "agent.budget_seconds",
    "agent.steer_fraction",
    "agent.budget_clock",
    "agent.termination",
    "agent.max_iterations",
    "offline",
    "offline.port",
    "offline.require_key",
    "offline.prefix_caching",
    "offline.latency",
    "offline.latency.kind",
    "offline.latency.seconds",
    "offline.latency.sigma",
    "offline.latency.max_seconds",
    "offline.quotas",
    "offline.quotas.requests_per_minute",
    "offline.quotas.tokens_per_minute",
    "offline.quotas.window_seconds",
    "offline.seed",
    "offline.request_log",
    "offline.model_aliases",
    "model.service_tier",  # only flex or batch: the standard tier names runs as before
    "model.serve",  # only a model the run serves: the others are named as before
    "model.serve.engine",
    "model.serve.model",
    "model.serve.args",
    "run",  # only an epoch after the first: epoch 1 is named as a run without epochs
    "run.epoch",
]
NOT_RUN_IDENTITY = [
    "model.serve.replicas",
    "model.serve.num_cpus",
    "model.serve.num_gpus",
    "model.serve.resources",
    "model.serve.price_per_replica_hour",
    "model.serve.startup_timeout",
    "model.serve.executable",
    "judge.model.serve",
    "judge.model.serve.engine",
    "judge.model.serve.model",
    "judge.model.serve.args",
    "judge.model.serve.replicas",
    "judge.model.serve.num_cpus",
    "judge.model.serve.num_gpus",
    "judge.model.serve.resources",
    "judge.model.serve.price_per_replica_hour",
    "judge.model.serve.startup_timeout",
    "judge.model.serve.executable",
    "judge.models.serve",
    "judge.models.serve.engine",
    "judge.models.serve.model",
    "judge.models.serve.args",
    "judge.models.serve.replicas",
    "judge.models.serve.num_cpus",
    "judge.models.serve.num_gpus",
    "judge.models.serve.resources",
    "judge.models.serve.price_per_replica_hour",
    "judge.models.serve.startup_timeout",
    "judge.models.serve.executable",
    "retrieval.index_root",
    "retrieval.dense.batch_size",
    "retrieval.dense.device",
    "retrieval.dense.shard_size",
    "retrieval.dense.build_actors",
    "retrieval.dense.num_gpus",
    "retrieval.dense.batch_wait",
    "model.prompt_caching",
    "model.rate_limit",
    "model.rate_limit.requests_per_minute",
    "model.rate_limit.tokens_per_minute",
    "model.rate_limit.initial_concurrency",
    "model.rate_limit.min_concurrency",
    "model.rate_limit.max_concurrency",
    "model.rate_limit.decrease_factor",
    "model.rate_limit.clean_period",
    "model.rate_limit.window_seconds",
    "model.rate_limit.window_margin",
    "model.rate_limit.output_tokens_guess",
    "model.rate_limit.estimate_margin",
    "runtime",
    "runtime.address",
    "runtime.num_cpus",
    "runtime.object_store_mb",
    "runtime.dashboard",
    "runtime.replicas",
    "runtime.cpus_per_replica",
    "runtime.max_concurrency",
    "runtime.max_restarts",
    "runtime.placement",
    "runtime.max_infrastructure_attempts",
    "runtime.max_failure_rate",
    "runtime.runs_root",
    "runtime.status_seconds",  # how often the live status is written: watching, not the run
    "runtime.metrics_export_port",
    "runtime.traces_endpoint",
    "judge",
    "judge.model",
    "judge.model.name",
    "judge.model.litellm_model",
    "judge.model.api_base",
    "judge.model.api_key_env",
    "judge.model.temperature",
    "judge.model.max_output_tokens",
    "judge.model.reasoning_effort",
    "judge.model.call_timeout",
    "judge.model.prompt_caching",
    "judge.model.extra",
    "judge.model.rate_limit",
    "judge.model.rate_limit.requests_per_minute",
    "judge.model.rate_limit.tokens_per_minute",
    "judge.model.rate_limit.initial_concurrency",
    "judge.model.rate_limit.min_concurrency",
    "judge.model.rate_limit.max_concurrency",
    "judge.model.rate_limit.decrease_factor",
    "judge.model.rate_limit.clean_period",
    "judge.model.rate_limit.window_seconds",
    "judge.model.rate_limit.window_margin",
    "judge.model.rate_limit.output_tokens_guess",
    "judge.model.rate_limit.estimate_margin",
    "judge.max_parse_retries",
    "judge.concurrency",
    "judge.seed",
    "pricing",
    "pricing.table",
    "pricing.allow_litellm_prices",
    "pricing.max_cost_usd",
    "judge.models",
    "judge.models.name",
    "judge.models.litellm_model",
    "judge.models.api_base",
    "judge.models.api_key_env",
    "judge.models.temperature",
    "judge.models.max_output_tokens",
    "judge.models.reasoning_effort",
    "judge.models.call_timeout",
    "judge.models.prompt_caching",
    "judge.models.extra",
    "judge.models.rate_limit",
    "judge.models.rate_limit.requests_per_minute",
    "judge.models.rate_limit.tokens_per_minute",
    "judge.models.rate_limit.initial_concurrency",
    "judge.models.rate_limit.min_concurrency",
    "judge.models.rate_limit.max_concurrency",
    "judge.models.rate_limit.decrease_factor",
    "judge.models.rate_limit.clean_period",
    "judge.models.rate_limit.window_seconds",
    "judge.models.rate_limit.window_margin",
    "judge.models.rate_limit.output_tokens_guess",
    "judge.models.rate_limit.estimate_margin",
    "judge.panel_ties",
    "offline.batch",
    "offline.batch.completion_seconds",
    "offline.batch.max_requests",
    "offline.batch.max_bytes",
    "run.epochs",
    "judge.model.service_tier",
    "judge.models.service_tier",
    "judge.batch_poll_seconds",
    "judge.template",
    "runtime.batch",
    "runtime.batch.gather_seconds",
    "runtime.batch.poll_seconds",
    "runtime.batch.queries_at_once",
]


def _fields(cls: type, prefix: str = "", identity: bool = True) -> list[tuple[str, bool]]:
    import typing

    from piserini_ray.config.base import StrictModel

    rows = []
    for name, info in cls.model_fields.items():  # type: ignore[attr-defined]
        counts = identity and name in cls.IDENTITY  # type: ignore[attr-defined]
        rows.append((prefix + name, counts))
        for arg in typing.get_args(info.annotation) or (info.annotation,):
            if isinstance(arg, type) and issubclass(arg, StrictModel):
                rows += _fields(arg, f"{prefix}{name}.", counts)
    return rows


def test_every_config_field_has_decided_whether_it_is_a_runs_identity() -> None:
    from piserini_ray.config import RunConfig

    rows = _fields(RunConfig)
    assert sorted(name for name, counts in rows if counts) == sorted(RUN_IDENTITY)
    assert sorted(name for name, counts in rows if not counts) == sorted(NOT_RUN_IDENTITY)


def test_a_model_field_without_a_decision_is_refused_when_the_class_is_defined() -> None:
    from pydantic import Field

    from piserini_ray.config.base import StrictModel

    with pytest.raises(TypeError, match=r"undecided: \['new_knob'\]"):

        class Knobs(StrictModel):
            IDENTITY = ("old",)
            old: int = 1
            new_knob: int = Field(2)


@pytest.mark.parametrize(
    ("path", "value"),
    [("runtime.replicas", 5), ("pricing.max_cost_usd", 3.0), ("judge.concurrency", 2)],
)
def test_what_is_not_identity_never_renames_a_run(path: str, value: object) -> None:
    assert load_config(None, {path: value}).config_hash() == RunConfig().config_hash()


def test_the_offline_settings_name_only_runs_that_the_offline_provider_serves() -> None:
    hosted = {"model.name": "gpt-x", "model.api_key_env": "KEY"}
    assert (
        load_config(None, hosted | {"offline.port": 5555}).config_hash()
        == load_config(None, hosted).config_hash()
    )
    assert load_config(None, {"offline.seed": 7}).config_hash() != load_config(None).config_hash()


#: Run names that must never change: the built-in defaults' (`configs/default.yaml`), and the
#: shipped rehearsal configs'. The offline section's fault settings left the product (to the
#: test kit) with these names kept (`OfflineConfig.RETIRED_IDENTITY`).
PINNED_HASHES = {
    None: "566fc1123f8b5d5c",
    "default.yaml": "566fc1123f8b5d5c",
    "batch_offline.yaml": "9d0032ea712e7e92",
    "browsecomp-plus.yaml": "536f0e11df7e3d30",
}


@pytest.mark.parametrize("name", list(PINNED_HASHES))
def test_existing_run_names_are_pinned(name: str | None) -> None:
    from pathlib import Path

    path = None if name is None else Path(__file__).resolve().parents[2] / "configs" / name
    assert load_config(path).config_hash() == PINNED_HASHES[name]
    if name is None:
        assert RunConfig().config_hash() == PINNED_HASHES[None]


def test_the_retired_fault_settings_stay_in_the_identity_as_constants() -> None:
    from piserini_ray.config import OfflineConfig, identity_data

    data = identity_data(OfflineConfig())
    assert data["hang_seconds"] == 3600.0
    assert data["faults"] == dict.fromkeys(
        (
            "http_500",
            "hang",
            "empty_reply",
            "malformed_arguments",
            "unknown_tool",
            "missing_fields",
        ),
        0.0,
    )


def test_a_manifest_written_with_the_old_fault_settings_loads_as_the_same_run() -> None:
    """Every manifest written before the faults left the config holds them at zero."""
    old = RunConfig().model_dump(mode="json")
    old["offline"] |= {"faults": {"http_500": 0.0, "hang": 0.0}, "hang_seconds": 3600.0}
    old["offline"]["batch"] |= {"error_rate": 0.0, "expire_rate": 0.0}
    loaded = RunConfig.model_validate(old)
    assert loaded == RunConfig() and loaded.config_hash() == PINNED_HASHES[None]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"offline.faults.http_500": 0.2}, "offline.faults"),
        ({"offline.faults": {"hang": 1.0}}, "offline.faults"),
        ({"offline.hang_seconds": 5}, "offline.hang_seconds"),
        ({"offline.batch.error_rate": 0.1}, "offline.batch.error_rate"),
        ({"offline.batch.expire_rate": 0.1}, "offline.batch.expire_rate"),
    ],
)
def test_a_config_that_sets_a_fault_is_told_where_faults_went(
    override: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, override)
    message = str(refused.value)
    assert f"{key} was removed" in message
    assert "piserini_ray_testkit.EmulatedProvider" in message and "model.api_base" in message


@pytest.mark.parametrize(
    ("model", "where"),
    [
        ("{name: gpt-5, extra: {api_key: abcdef123456}}", "model.extra.api_key"),
        ("{name: gpt-5, extra: {headers: {X-Auth: sk-proj-0123456789abcdefghij}}}", "X-Auth"),
        ("{name: gpt-5, api_base: 'https://proxy.example/v1?key=abcdef123456'}", "'key'"),
        ("{name: gpt-5, api_base: 'https://user:hunter2pass@proxy.example/v1'}", "user info"),
    ],
)
def test_a_key_in_a_model_block_exits_2_before_anything_runs(
    tmp_path: Path, capsys, model: str, where: str
) -> None:
    from piserini_ray.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(f"model: {model}\nruntime: {{runs_root: '{tmp_path / 'runs'}'}}\n")
    assert main(["run", "--engine", "local", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert where in err and "model.api_key_env" in err
    assert not (tmp_path / "runs").exists()


def test_the_manifest_keeps_no_secret_of_the_environment(tmp_path: Path, monkeypatch) -> None:
    from piserini_ray.store import RunStore

    secret = "s3cr3t-value-0123456789"
    monkeypatch.setenv("PISERINI_TEST_TOKEN", secret)
    config = load_config(None, {"model.name": "offline/heuristic", "model.extra": {"x": secret}})
    with RunStore(tmp_path / "run", config):
        pass
    assert secret not in (tmp_path / "run" / "manifest.json").read_text()


def test_epoch_one_is_named_as_a_run_without_epochs_and_each_later_epoch_apart() -> None:
    """Raising `run.epochs` adds epochs to the same run: the first keeps the run's name."""
    from piserini_ray.config import RunConfig

    plain = RunConfig()
    three = RunConfig.model_validate({"run": {"epochs": 3}})
    assert three.config_hash() == plain.config_hash()
    hashes = {three.for_epoch(e).config_hash() for e in (1, 2, 3)}
    assert len(hashes) == 3 and plain.config_hash() in hashes
    assert [three.for_epoch(e).run.request_seed() for e in (1, 2, 3)] == [None, 2, 3]


@pytest.mark.parametrize("name", ["../../etc", "a/b", ".hidden", "..", "x" * 101, "with space"])
def test_the_benchmark_name_is_a_plain_folder_name(name: str) -> None:
    with pytest.raises(ConfigError, match=r"benchmark\.name"):
        load_config(None, {"benchmark.name": name})
    assert load_config(None, {"benchmark.name": "browsecomp-plus_v1.2"}).benchmark.name
