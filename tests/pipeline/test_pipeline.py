"""`prepare()`: everything that can be checked is checked before a run directory exists and
before a token is paid for (real files, a real index)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson
import pytest

from piserini_ray.config import load_config
from piserini_ray.errors import ConfigError, DataError
from piserini_ray.pipeline import prepare, run_local
from piserini_ray.store import RunStore

DOCS = [
    {"docid": "d1", "title": "Okapi", "text": "The okapi lives in the Ituri rainforest."},
    {"docid": "d2", "title": "Zebra", "text": "Zebras have black and white stripes."},
    {"docid": "d3", "title": "Giraffe", "text": "The giraffe is the tallest living animal."},
]
QUERIES = [
    {"query_id": "q1", "query": "Where does the okapi live?", "answer": "Ituri rainforest"},
    {"query_id": "q2", "query": "Which animal is the tallest?", "answer": "giraffe"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _benchmark(tmp_path: Path, qrels: str = "q1 Q0 d1 1\nq2 Q0 d3 1\n", docs=DOCS) -> Path:
    _jsonl(tmp_path / "queries.jsonl", QUERIES)
    _jsonl(tmp_path / "corpus.jsonl", docs)
    (tmp_path / "evidence.txt").write_text(qrels)
    config = tmp_path / "bench.yaml"
    config.write_text(
        "benchmark: {source: jsonl, name: animals, queries: queries.jsonl, "
        "corpus: corpus.jsonl, qrels_evidence: evidence.txt}\n"
        f"retrieval: {{index_root: {tmp_path / 'indexes'}}}\n"
    )
    return config


def _prepare(config_path: Path, run_dir: Path, log=lambda _m: None):
    with contextlib.ExitStack() as stack:
        return prepare([(load_config(config_path), run_dir)], log, stack)


def test_qrels_naming_documents_outside_the_corpus_warn_with_counts(tmp_path: Path) -> None:
    config = _benchmark(tmp_path, "q1 Q0 d1 1\nq1 Q0 gone 1\nq2 Q0 d3 1\n")
    messages: list[str] = []
    (run,) = _prepare(config, tmp_path / "run", messages.append)
    assert [q.query_id for q in run.todo] == ["q1", "q2"]
    assert any(
        "1 of 3 evidence qrels name documents that are not in the corpus (e.g. 'gone')" in m
        for m in messages
    )


@pytest.mark.parametrize(
    ("qrels", "problem"),
    [
        ("q1 Q0 gone 1\nq2 Q0 lost 1\n", "none of the 2 documents of these evidence qrels"),
        ("x1 Q0 d1 1\nx2 Q0 d3 1\n", "none of the 2 query ids of these evidence qrels"),
    ],
)
def test_unusable_qrels_stop_before_the_run_directory_exists(
    tmp_path: Path, qrels: str, problem: str
) -> None:
    config = _benchmark(tmp_path, qrels)
    with pytest.raises(DataError, match=rf"evidence\.txt: {problem}"):
        _prepare(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_duplicate_docid_names_file_and_line_and_leaves_no_run_behind(tmp_path: Path) -> None:
    config = _benchmark(tmp_path, docs=[*DOCS, {"docid": "d2", "text": "again"}])
    with pytest.raises(
        DataError, match=r"corpus\.jsonl:4: docid 'd2' appears twice \(first on line 2\)"
    ):
        run_local(load_config(config), tmp_path / "run", log=lambda _m: None)
    assert not (tmp_path / "run").exists()
    _jsonl(tmp_path / "corpus.jsonl", DOCS)  # the user fixes the file: the same run dir works
    summary = run_local(load_config(config), tmp_path / "run", log=lambda _m: None)
    assert summary.queries == 2


def test_a_torn_corpus_line_is_named(tmp_path: Path) -> None:
    config = _benchmark(tmp_path)
    with open(tmp_path / "corpus.jsonl", "ab") as f:
        f.write(b'{"docid": "d4", "text": "cut')
    with pytest.raises(DataError, match=r"corpus\.jsonl:4"):
        _prepare(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_sample_larger_than_the_benchmark_is_an_error(tmp_path: Path) -> None:
    config = load_config(None, {"slice.sample": 500})
    too_many = r"slice.sample: asks for 500 queries but .* has 100"
    with pytest.raises(DataError, match=too_many), contextlib.ExitStack() as stack:
        prepare([(config, tmp_path / "run")], lambda _m: None, stack)
    assert not (tmp_path / "run").exists()


def test_data_paths_without_a_source_are_an_error(tmp_path: Path) -> None:
    config = tmp_path / "forgot.yaml"
    config.write_text("benchmark: {queries: q.jsonl, corpus: c.jsonl}\n")
    with pytest.raises(
        ConfigError, match=r"benchmark.queries is set but benchmark.source is 'sample'"
    ):
        load_config(config)


def test_the_local_engine_asks_the_models_limiter_for_every_call(
    sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    """`--engine local` honours `model.rate_limit`: every attempt it sent was granted by the
    process's limiter for that quota key (the same one `ask` and the judge use)."""
    from piserini_ray.llm.limiter import LOCAL_LIMITERS

    config = load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "slice.sample": 2,
            "slice.seed": 9,
            "model.rate_limit.requests_per_minute": 500,
        },
    )
    limiter = LOCAL_LIMITERS.limiter(config.model, config.offline).limiter
    before = limiter.granted
    run_local(config, tmp_path / "run", log=lambda _m: None)
    with RunStore(tmp_path / "run", config) as store:
        attempts = sum(t.attempts for r in store.records() for t in r.trajectory)
    assert attempts > 0 and limiter.granted - before == attempts


def test_run_directories_live_under_the_runs_root_wherever_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resubmitted job (whose working directory is a fresh copy) finds the same run
    directory: it depends on the config and `runtime.runs_root`, never on the cwd."""
    from piserini_ray.pipeline import default_run_dir

    monkeypatch.setenv("PISERINI_RAY_HOME", str(tmp_path / "home"))
    config = load_config(None)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = default_run_dir(config)
    monkeypatch.chdir(tmp_path / "b")
    assert default_run_dir(config) == first and first.is_absolute()
    assert first.parent == tmp_path / "home" / "runs"
    assert first.name.endswith(config.config_hash()[:8])
    moved = load_config(None, {"runtime.runs_root": str(tmp_path / "results")})
    assert default_run_dir(moved).parent == tmp_path / "results"
    assert moved.config_hash() == config.config_hash()  # where results go is not identity


def test_failures_not_the_querys_fault_run_again_and_retry_failed_runs_every_failure(
    tmp_path: Path,
) -> None:
    """A failed record marked `retryable` (a lost replica or node) is taken out and run again by
    the next `prepare`; an ordinary failure stays the query's result unless `retry_failed`. What
    was taken out moves to records.retried.jsonl, and no query is ever recorded twice."""
    from piserini_ray.records import QueryRecord, now_iso

    config_path = _benchmark(tmp_path, "q1 Q0 d1 1\nq2 Q0 d3 1\n")
    run_dir = tmp_path / "run"
    with RunStore(run_dir, load_config(config_path)) as store:
        for query_id, status, retryable in (("q1", "failed", True), ("q2", "failed", False)):
            store.append(
                QueryRecord(
                    run_id=store.run_id,
                    config_hash=store.config_hash,
                    query_id=query_id,
                    model="m",
                    status=status,
                    retryable=retryable,
                    started_at=now_iso(),
                    finished_at=now_iso(),
                )
            )
    messages: list[str] = []
    (run,) = _prepare(config_path, run_dir, messages.append)
    assert [q.query_id for q in run.todo] == ["q1"]  # q2's failure is its own result
    assert any("1 failed query not the query's fault run again" in m for m in messages)
    with contextlib.ExitStack() as stack:
        (again,) = prepare([(load_config(config_path), run_dir)], print, stack, retry_failed=True)
    assert sorted(q.query_id for q in again.todo) == ["q1", "q2"]
    retried = (run_dir / "records.retried.jsonl").read_text().splitlines()
    assert len(retried) == 2 and (run_dir / "records.jsonl").read_text() == ""


def test_a_node_running_other_code_is_named_before_any_query() -> None:
    from piserini_ray.engines.ray.identity import code_identity
    from piserini_ray.engines.ray.replicas import SchedulerError, check_same_code

    ours = code_identity()
    check_same_code([{"ip": "10.0.0.1", "code": ours}, {"ip": "10.0.0.2", "code": ours}])
    with pytest.raises(SchedulerError, match=r"10\.0\.0\.2 runs 0\.0\.9\+abc"):
        check_same_code([{"ip": "10.0.0.1", "code": ours}, {"ip": "10.0.0.2", "code": "0.0.9+abc"}])
