"""The Ray runtime on one local Ray instance shared by this module (2 CPUs, small object store).

Multi-node and crash tests live in test_faults.py: they need Ray instances of their own.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import ray
import yaml
from conftest import finishes
from helpers import wait_for

from piserini_ray.config import RunConfig, load_config
from piserini_ray.engines.ray.driver_services import driver_services
from piserini_ray.llm.limiter import quota_key
from piserini_ray.offline import OfflineConfig, QuotaConfig
from piserini_ray.pipeline import run_on_ray
from piserini_ray.sweep import expand_sweep
from piserini_ray_testkit import EmulatedProvider, Scripted

ROOT = Path(__file__).resolve().parents[3]


pytestmark = pytest.mark.usefixtures("module_ray")


def _config(index_root: Path, **overrides: object) -> RunConfig:
    return load_config(None, {"retrieval.index_root": str(index_root), **overrides})


def _ids(run_dir: Path) -> list[str]:
    lines = (run_dir / "records.jsonl").read_bytes().splitlines()
    return [orjson.loads(line)["query_id"] for line in lines]


def test_run_records_every_query_once_and_resumes(sample_index, index_root, tmp_path) -> None:
    logs: list[str] = []
    config = _config(index_root, **{"slice.sample": 6, "slice.seed": 1})
    (summary,) = run_on_ray([(config, tmp_path / "run")], logs.append)
    assert summary.queries == 6 and summary.ran_now == 6 and summary.statuses == {"completed": 6}
    assert sorted(_ids(tmp_path / "run")) == sorted(set(_ids(tmp_path / "run")))
    assert any("1 searcher replica(s) ready" in m for m in logs)
    (again,) = run_on_ray([(config, tmp_path / "run")], logs.append)
    assert again.ran_now == 0 and again.queries == 6
    assert len(_ids(tmp_path / "run")) == 6


def test_sweep_two_models_two_timeouts_share_replicas(sample_index, index_root, tmp_path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "name: s\n"
        f"set: {{retrieval.index_root: '{index_root}', slice.sample: 3, slice.seed: 2}}\n"
        "grid:\n"
        "  model.name: [offline/heuristic, offline/exact-match-judge]\n"
        "  agent.budget_seconds: [60, 120]\n"
    )
    runs = expand_sweep(sweep, tmp_path / "runs")
    assert len(runs) == 4 and len({d for _, d in runs}) == 4
    assert len({c.config_hash() for c, _ in runs}) == 4
    logs: list[str] = []
    summaries = run_on_ray(list(runs), logs.append)
    assert [s.queries for s in summaries] == [3, 3, 3, 3]
    assert any("1 searcher replica(s) ready" in m for m in logs)  # one index, one BM25: shared
    for (_, run_dir), summary in zip(runs, summaries, strict=True):
        assert len(set(_ids(run_dir))) == 3 == len(_ids(run_dir)) and summary.ran_now == 3
    assert {s.model for s in summaries} == {"offline/heuristic", "offline/exact-match-judge"}
    assert all(s.ran_now == 0 for s in run_on_ray(list(runs), logs.append))  # resumes whole


def _alive_replicas() -> int:
    from ray._private.state import actors  # the GCS's actor table (a debugging API)

    alive = actors(actor_state_name="ALIVE").values()
    return sum(1 for a in alive if a["ActorClassName"] == "SearchWorker")


def test_replicas_come_up_while_prepare_checks_the_data(
    sample_index, index_root, tmp_path, monkeypatch
) -> None:
    import piserini_ray.pipeline as pipeline

    wait_for("no replica alive", lambda: _alive_replicas() == 0, 120)  # earlier tests' gone
    real_prepare = pipeline.prepare
    up_during_prepare: list[bool] = []

    def prepare(*args, **kwargs):
        # The engine started the replica before the data check: it comes up meanwhile.
        wait_for("one replica up", lambda: _alive_replicas() == 1, 120)
        up_during_prepare.append(True)
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(pipeline._running, "prepare", prepare)
    config = _config(index_root, **{"slice.sample": 2, "slice.seed": 3})
    (summary,) = run_on_ray([(config, tmp_path / "run")], lambda _m: None)
    assert up_during_prepare == [True] and summary.ran_now == 2
    wait_for("no replica alive", lambda: _alive_replicas() == 0, 120)  # and it ends with the run


def test_a_data_error_after_the_early_start_leaves_no_replica_behind(tmp_path) -> None:
    from piserini_ray.data import load_benchmark
    from piserini_ray.errors import DataError
    from piserini_ray.retrieval import ensure_index

    (tmp_path / "queries.jsonl").write_text(
        '{"query_id": "q1", "query": "okapi?", "answer": "x"}\n'
    )
    (tmp_path / "corpus.jsonl").write_text('{"docid": "d1", "text": "The okapi lives."}\n')
    (tmp_path / "evidence.txt").write_text("nobody Q0 d1 1\n")  # no query of the benchmark
    path = tmp_path / "bench.yaml"
    path.write_text(
        "benchmark: {source: jsonl, name: okapi, queries: queries.jsonl, corpus: corpus.jsonl, "
        f"qrels_evidence: evidence.txt}}\nretrieval: {{index_root: {tmp_path / 'indexes'}}}\n"
    )
    config = load_config(path)
    ensure_index(load_benchmark(config.benchmark).corpus, config.retrieval)  # so it starts early
    wait_for("no replica alive", lambda: _alive_replicas() == 0, 120)
    with pytest.raises(DataError, match="none of the 1 query ids of these evidence qrels"):
        run_on_ray([(config, tmp_path / "run")], lambda _m: None)
    assert not (tmp_path / "run").exists()
    wait_for("no replica alive", lambda: _alive_replicas() == 0, 120)


def test_limiter_keeps_the_provider_under_its_quota(sample_index, index_root, tmp_path) -> None:
    # Time scaled down: 6 requests per 2 s window on the server, the same in the limiter.
    server = OfflineConfig(quotas=QuotaConfig(requests_per_minute=6, window_seconds=2))
    with EmulatedProvider(server) as provider:
        config = _config(
            index_root,
            **{
                "slice.sample": 2,
                "model.api_base": provider.base_url,
                "model.rate_limit": {
                    "requests_per_minute": 6,
                    "window_seconds": 2,
                    "window_margin": 0.3,
                },
            },
        )
        (summary,) = run_on_ray([(config, tmp_path / "run")], lambda _m: None)
        faults = [r.fault for r in provider.requests]
    assert summary.statuses == {"completed": 2}
    assert len(faults) >= 10 and "quota" not in faults  # the server never had to refuse one
    # Every call's end reached the limiter, the last one's too (a replica's ends ride on its
    # next acquire; each query's end sends what waits): no slot is held after the run.
    key = quota_key(config.model, config.offline)
    services = driver_services(start=True)
    wait_for(
        "every slot given back",
        lambda: ray.get(services.stats.remote(key), timeout=60).in_flight == 0,
        deadline_s=60,
    )
    records = [
        orjson.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_bytes().splitlines()
    ]
    assert sum(r["waited_seconds"] for r in records) > 0  # the limiter held requests back


def test_429_storm_everyone_finishes_and_waits_are_waited(
    sample_index, index_root, tmp_path
) -> None:
    with EmulatedProvider(OfflineConfig()) as provider:
        provider.script(*[Scripted(kind="rate_limit", retry_after=0.3)] * 6)
        config = _config(
            index_root,
            **{
                "slice.sample": 3,
                "model.api_base": provider.base_url,
                "retry.backoff_base": 0.05,
                "agent.budget_seconds": 30,
            },
        )
        (summary,) = run_on_ray([(config, tmp_path / "run")], lambda _m: None)
        statuses = [r.status for r in provider.requests]
    assert statuses.count(429) == 6
    assert summary.statuses == {"completed": 3}
    records = [
        orjson.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_bytes().splitlines()
    ]
    retries = [r for rec in records for t in rec["trajectory"] for r in t["retries"]]
    assert len(retries) == 6 and all(r.startswith("rate_limit") for r in retries)
    assert sum(r["waited_seconds"] for r in records) >= 0.3 * 2


def test_judging_and_reducing_on_ray_match_the_plain_path(
    sample_index, index_root, tmp_path
) -> None:
    from piserini_ray.pipeline import finish

    config = _config(index_root, **{"slice.sample": 5, "slice.seed": 4})
    run_on_ray([(config, tmp_path / "run")], lambda _m: None)
    on_ray = finish(config, tmp_path / "run", lambda _m: None, on_ray=True)
    verdicts = (tmp_path / "run" / "judgements").glob("*.jsonl")
    assert [len(p.read_bytes().splitlines()) for p in verdicts] == [5]
    plain = finish(config, tmp_path / "run", lambda _m: None, judge=False)
    assert on_ray.model_dump() == plain.model_dump()  # the same figures either way
    assert on_ray.queries == 5 and on_ray.depth_curve["evidence"][1000] is not None
    assert (tmp_path / "run" / "report.html").exists()


def test_bm25_grid_on_ray_is_complete_correct_and_resumable(
    sample_index, index_root, tmp_path
) -> None:
    import matplotlib.image

    from piserini_ray.analysis.bm25_grid import best_cell
    from piserini_ray.engines.ray.bm25_grid import tune_on_ray
    from piserini_ray.reports.bm25_grid import write_grid_outputs

    config = _config(index_root, **{"slice.sample": 20, "slice.seed": 1})
    logs: list[str] = []
    k1s, bs = [0.9, 4.0, 25.0], [0.4, 0.7, 1.0]
    # 3 workers of 1 CPU on this 2-CPU Ray: the third would never start, and the cells given
    # to it would never finish; 2 run.
    wait_for("both CPUs free", lambda: ray.available_resources().get("CPU") == 2, 120)
    cells, _ = finishes(lambda: tune_on_ray(config, k1s, bs, tmp_path, 3, logs.append))
    assert any(
        m.startswith("3 grid workers of CPU 1 each do not fit what this Ray has free (CPU 2")
        and m.endswith("starting 2")
        for m in logs
    )
    assert {(c.k1, c.b) for c in cells} == {(k, b) for k in k1s for b in bs}
    best = write_grid_outputs(cells, "evidence_recall@100", tmp_path)
    top = max(c.metrics["evidence_recall@100"] for c in cells)
    assert best.metrics["evidence_recall@100"] == top and best == best_cell(
        cells, "evidence_recall@100"
    )
    assert f"k1: {best.k1:g}, b: {best.b:g}" in (tmp_path / "best.yaml").read_text()
    assert len((tmp_path / "grid.csv").read_text().splitlines()) == 10
    pixels = matplotlib.image.imread(tmp_path / "heatmap.png")
    red = (pixels[..., 0] > 0.9) & (pixels[..., 1] < 0.1) & (pixels[..., 2] < 0.1)
    assert red.sum() > 10  # the best cell's red star is drawn
    # The killed workers hand their CPUs back a moment later: the resumed grid waits for them
    # as the first did, then its first line says what it found.
    wait_for("both CPUs free", lambda: ray.available_resources().get("CPU") == 2, 120)
    resumed: list[str] = []
    again, _ = tune_on_ray(config, k1s, [*bs, 0.0], tmp_path, 1, resumed.append)
    assert "12 cells, 9 done before, 3 to run" in resumed[0] and len(again) == 12


def test_spill_files_of_replicas_land_in_the_run_directory(
    sample_index, index_root, tmp_path
) -> None:
    """Replicas write nothing: the spill texts ride back with the record and the driver's
    store writes them (on a cluster a replica's disk is another machine's)."""
    config = _config(index_root, **{"slice.sample": 2, "slice.seed": 3, "tools.spill_max_lines": 4})
    run_on_ray([(config, tmp_path / "run")], lambda _m: None)
    raw = (tmp_path / "run" / "records.jsonl").read_bytes()
    assert b'"spills"' not in raw
    spilled = [
        (record["query_id"], call["spill_file"])
        for record in map(orjson.loads, raw.splitlines())
        for turn in record["trajectory"]
        for call in turn["tool_calls"]
        if call["spill_file"]
    ]
    assert len(spilled) >= 2
    from piserini_ray.tools.spill import safe_component

    for query_id, name in spilled:
        text = (tmp_path / "run" / "spill" / safe_component(query_id) / name).read_text()
        assert len(text.splitlines()) > 4  # the full output, not the truncated one


def test_verdicts_are_written_as_each_arrives_on_ray(sample, tmp_path) -> None:
    """One judge call hangs: the chunk's other verdicts are on disk before it returns (a
    crash then loses one paid call, not a chunk of them)."""
    import threading

    from piserini_ray.engines.ray.judging import judge_on_ray
    from piserini_ray.records import QueryRecord, now_iso
    from piserini_ray.store import RunStore

    config = RunConfig()
    queries = {q.query_id: q for q in sample.queries[:6]}
    with EmulatedProvider(OfflineConfig()) as provider, RunStore(tmp_path / "run", config) as store:
        records = [
            QueryRecord(
                run_id=store.run_id,
                config_hash=store.config_hash,
                query_id=qid,
                model="m",
                status="completed",
                final_answer=f"Exact Answer: {q.answer}\nConfidence: 90%",
                started_at=now_iso(),
                finished_at=now_iso(),
            )
            for qid, q in queries.items()
        ]
        provider.script(Scripted(kind="hang", seconds=5, model="offline/exact-match-judge"))
        path = store.judgements_path(config.judge_model().name)
        seen_while_judging: list[int] = []
        judged = threading.Thread(
            target=judge_on_ray,
            args=(config, store, records, queries, provider.base_url, lambda _m: None),
        )
        judged.start()
        while judged.is_alive():
            if path.exists():
                seen_while_judging.append(len(path.read_bytes().splitlines()))
            judged.join(timeout=0.05)
        assert 5 in seen_while_judging  # five on disk while the sixth still hung
        assert len(store.judgements(config.judge_model().name)) == 6


@pytest.mark.slow  # the dense sample index
def test_the_backends_sweep_compares_them_at_matched_depth(
    sample_index, dense_sample, index_root, tmp_path, capsys
) -> None:
    from piserini_ray.cli import main

    sweep = yaml.safe_load((ROOT / "configs" / "sweep_backends.yaml").read_text())
    assert len(sweep["variants"]) == 6  # the shipped file; four of its runs keep this test short
    sweep["variants"] = [
        v
        for v in sweep["variants"]
        if (v["retrieval.backend"], v["retrieval.depth"]) not in {("dense", 1000), ("bm25", 5)}
    ]
    sweep["set"] |= {"retrieval.index_root": str(index_root), "slice.sample": 2}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert main(["sweep", str(path), "--runs-root", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    # Four retrieval settings, four replicas, two CPUs: the reservation shrinks, none waits.
    assert "4 searcher replicas on 2 CPUs: each reserves 0.5 CPU" in err
    report = (tmp_path / "backends" / "report.md").read_text()
    section = report.split("## Retrieval backends at matched depth", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith(("| 1000 |", "| 5 |"))]
    assert [tuple(c.strip() for c in r.split("|")[1:3]) for r in rows] == [
        ("1000", "bm25"),
        ("1000", "hybrid"),
        ("1000", "rerank"),
        ("5", "dense"),
    ]
    assert "## Paired comparison" in report and (tmp_path / "backends" / "depth.png").exists()
    for run_dir in (tmp_path / "backends").glob("backend=*"):
        backend = run_dir.name.split("-", 1)[0].split("=", 1)[1]
        for line in (run_dir / "records.jsonl").read_bytes().splitlines():
            assert {r["backend"] for r in orjson.loads(line)["rankings"]} <= {backend}


def test_tune_bm25_puts_every_backend_floor_beside_the_best_cell(
    sample_index, dense_sample, index_root, tmp_path, capsys
) -> None:
    from piserini_ray.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(f"retrieval: {{index_root: '{index_root}'}}\nslice: {{sample: 12}}\n")
    out = tmp_path / "grid"
    assert (
        main(
            [
                "tune-bm25",
                str(config),
                "--k1",
                "0.9,25",
                "--b",
                "1.0",
                "--out",
                str(out),
                "--backends",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    table = (out / "backends.md").read_text()
    assert table.splitlines()[0].startswith("No-LLM floor of every backend at the best BM25")
    header = table.splitlines()[2].split()
    assert header == ["bm25", "dense", "hybrid", "rerank"] and table in printed + "\n"
    # The table's BM25 column is the best cell's own figures.
    best = [orjson.loads(x) for x in (out / "cells.jsonl").read_bytes().splitlines()]
    chosen = max(best, key=lambda c: c["metrics"]["evidence_recall@1000"])
    row = next(line for line in table.splitlines() if "evidence_recall@1000" in line).split()
    assert row[1] == f"{100 * chosen['metrics']['evidence_recall@1000']:.2f}%"


@pytest.mark.parametrize("route", ["openai/gpt-5", "anthropic/claude-haiku-4-5"])
def test_batched_turns_on_ray_go_through_one_batcher_and_match_the_standard_tier(
    sample_index, index_root, tmp_path, route: str
) -> None:
    """`model.service_tier: batch` on Ray: the replicas hand every turn to the run's batcher
    actor on the driver's node (OpenAI's Batch API, or Anthropic's Message Batches), whose first
    batch holds the first turn of every query; the trajectories are those of the standard tier
    (run locally), at half the cost."""
    from piserini_ray.config.offline import BatchConfig
    from piserini_ray.pipeline import run_local

    provider_name, on_route = route.split("/")
    served = OfflineConfig(
        model_aliases={on_route: "offline/heuristic"}, batch=BatchConfig(completion_seconds=0.1)
    )
    trajectories, costs = {}, {}
    for tier in ("standard", "batch"):
        with EmulatedProvider(served) as provider:
            model = {"name": on_route, "litellm_model": route, "api_base": provider.base_url,
                     "service_tier": tier}  # fmt: skip
            if provider_name == "anthropic":  # litellm adds /v1/messages to the host itself
                model |= {"name": "claude-haiku-4.5", "max_output_tokens": 2048,
                          "prompt_caching": "off",
                          "api_base": provider.base_url.removesuffix("/v1")}  # fmt: skip
            config = _config(
                index_root,
                **{
                    "slice.sample": 4,
                    "slice.seed": 2,
                    "model": model,
                    "agent": {"termination": "iterations", "max_iterations": 12},
                    "runtime.batch": {"gather_seconds": 0.5, "poll_seconds": 0.05},
                },
            )
            run_dir = tmp_path / tier
            if tier == "batch":
                (summary,) = run_on_ray([(config, run_dir)], lambda _m: None)
                batched = [r for r in provider.requests if r.batch_id is not None]
            else:
                summary = run_local(config, run_dir, log=lambda _m: None)
        assert summary.statuses == {"completed": 4}
        costs[tier] = summary.cost_usd
        rows = [orjson.loads(x) for x in (run_dir / "records.jsonl").read_bytes().splitlines()]
        trajectories[tier] = {
            r["query_id"]: [[c["arguments"] for c in t["tool_calls"]] for t in r["trajectory"]]
            + [r["final_answer"]]
            for r in rows
        }
    assert trajectories["batch"] == trajectories["standard"]
    # summary costs are rounded to 4 digits
    assert costs["batch"] == pytest.approx(0.5 * costs["standard"], abs=1e-4)
    first = min(batched, key=lambda r: r.seq).batch_id
    assert sum(1 for r in batched if r.batch_id == first) == 4  # every query's first turn
    ledger = (tmp_path / "batch" / "agent_batches.jsonl").read_bytes().splitlines()
    assert any(b'"closed"' in line for line in ledger)


@pytest.mark.slow
def test_stop_when_decided_on_ray_with_the_worse_run_at_the_batch_tier(
    sample, sample_index, index_root, tmp_path, monkeypatch
) -> None:
    """On Ray, the queries of a `stop_when_decided` sweep go out side by side in the shared
    order; the worse run's turns travel in batches (its answers, so the test's looks, come a
    batch at a time); it stops on a prefix of the order, and the reference, needed by no run
    any more, stops after it."""
    from oracle_provider import OracleProvider

    from piserini_ray.analysis.stopping import read_decision, shared_order
    from piserini_ray.api import run_sweep

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-oracle")
    with OracleProvider(sample.queries) as oracle:
        sweep = {
            "name": "decide",
            "set": {"retrieval.index_root": str(index_root), "slice.sample": 40},
            "variants": [
                {"model.name": "gpt-5.4-mini", "model.api_base": oracle.base_url},
                {
                    "model.name": "gpt-5.4",
                    "model.service_tier": "batch",
                    "agent.termination": "iterations",
                    "agent.max_iterations": 40,
                    "offline.model_aliases": {"gpt-5.4": "offline/heuristic"},
                    "offline.batch.completion_seconds": 0.3,
                    "runtime.batch.gather_seconds": 0.3,
                    "runtime.batch.poll_seconds": 0.1,
                },
            ],
            "reference": {"model.name": "gpt-5.4-mini"},
            "stop_when_decided": {"alpha": 0.05},
        }
        path = tmp_path / "sweep.yaml"
        path.write_text(yaml.safe_dump(sweep))
        logs: list[str] = []
        report, status = run_sweep(path, tmp_path / "runs", "ray", log=logs.append)
    assert status == 0
    reference, batched = (Path(m.run_dir) for m in report.metrics)
    decision = read_decision(batched)
    assert decision is not None and decision.direction == "worse"
    assert decision.decided_at is not None
    order = shared_order([q.query_id for q in _slice(sample, 40)], 0)
    for run in (batched, reference):
        ran = _ids(run)
        assert decision.decided_at <= len(ran) < 40
        assert set(ran) == set(order[: len(ran)])  # a prefix: the queue kept the order
        assert orjson.loads((run / "status.json").read_bytes())["state"] == "decided"
    assert (batched / "agent_batches.jsonl").exists()  # its turns went out in batches
    referenced = read_decision(reference)
    assert referenced is not None and referenced.compared == {str(batched): True}
    assert any("every run compared with it is decided" in m for m in logs)


def _slice(sample, n: int):
    from piserini_ray.config import SliceConfig

    return sample.select(**SliceConfig(sample=n).model_dump())
