"""Actors that cannot start are clear errors, and a slow start says what it waits for
(`engines/ray/readiness.py`): never a silent hang. Real actors on a local Ray of this module's own
(2 CPUs, no GPU)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import ray
from conftest import finishes
from helpers import wait_for

from piserini_ray.config import DenseConfig, load_config
from piserini_ray.engines.ray import readiness
from piserini_ray.engines.ray.encoder_actors import ray_shard_encoder, start_node_encoders
from piserini_ray.engines.ray.readiness import StartupError, wait_until_up
from piserini_ray.engines.ray.replicas import Replicas
from piserini_ray.pipeline import run_on_ray

pytestmark = pytest.mark.usefixtures("module_ray")


def test_query_encoders_asking_for_a_gpu_no_node_has_are_an_error() -> None:
    with pytest.raises(StartupError, match=r"num_gpus is 1, and no node .* set it to 0"):
        finishes(lambda: start_node_encoders(DenseConfig(num_gpus=1)))


def test_index_encoders_asking_for_a_gpu_no_node_has_are_an_error() -> None:
    encode = ray_shard_encoder(DenseConfig(num_gpus=1))
    with pytest.raises(StartupError, match=r"need CPU 1, GPU 1 each.*num_gpus to 0"):
        finishes(lambda: list(encode(iter([(0, ["a passage"])]))))


def test_a_dense_run_asking_for_a_gpu_stops_with_the_fix(
    sample_index, index_root, tmp_path
) -> None:
    config = load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "retrieval.backend": "dense",
            "retrieval.dense.num_gpus": 1,
            "slice.sample": 1,
        },
    )
    with pytest.raises(StartupError, match="num_gpus"):
        finishes(lambda: run_on_ray([(config, tmp_path / "run")], lambda _m: None))


def test_a_replica_whose_constructor_fails_is_a_clean_error_naming_the_cause(
    tmp_path: Path,
) -> None:
    (tmp_path / "queries.jsonl").write_text('{"query_id": "q1", "query": "q", "answer": "a"}\n')
    path = tmp_path / "bench.yaml"
    path.write_text(
        "benchmark: {source: jsonl, name: gone, queries: queries.jsonl, corpus: missing.jsonl}\n"
        f"retrieval: {{index_root: {tmp_path / 'indexes'}}}\n"
    )
    config = load_config(path)
    replicas = Replicas([config], lambda _m: None)
    replicas.add([config], lambda _m: None)
    try:
        with pytest.raises(
            StartupError, match=r"searcher replicas could not start: .*missing\.jsonl"
        ):
            replicas.ready(lambda _m: None)
    finally:
        replicas.close()


@ray.remote(num_cpus=0)
class _SlowStart:
    def __init__(self, gate: str) -> None:
        while not Path(gate).exists():  # up only once the test opens the gate
            time.sleep(0.02)

    def ready(self) -> str:
        return "up"


def test_a_slow_start_says_what_it_waits_for(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(readiness, "PROGRESS_SECONDS", 0.1)
    gate = tmp_path / "gate"
    actor = _SlowStart.remote(str(gate))
    logs: list[str] = []
    said = threading.Event()

    def log(message: str) -> None:
        logs.append(message)
        said.set()

    results: list[list[str]] = []
    waiter = threading.Thread(
        target=lambda: results.append(wait_until_up([actor.ready.remote()], "slow actors", log))
    )
    waiter.start()
    assert said.wait(60)  # it says so while the actor is still starting
    gate.touch()
    waiter.join(60)
    assert results == [["up"]]
    assert logs[0].startswith("waiting for 1 of 1 slow actors to start (free now: CPU 2")


def test_more_index_encoders_than_cpus_start_as_many_as_fit() -> None:
    # 3 encoder actors of 1 CPU on this 2-CPU Ray: the third would wait forever, and the
    # whole build (which waits for every actor) with it.
    # An earlier test's replica gives its CPU back.
    wait_for("both CPUs free", lambda: ray.available_resources().get("CPU") == 2, 60)
    logs: list[str] = []
    encode = ray_shard_encoder(DenseConfig(build_actors=3), logs.append)
    shards = [(0, ["the okapi"]), (1, ["a giraffe"]), (2, ["a zebra"])]
    vectors = dict(finishes(lambda: list(encode(iter(shards)))))
    assert sorted(vectors) == [0, 1, 2] and all(v.shape[0] == 1 for v in vectors.values())
    assert any(
        m.startswith("3 encoder actors of CPU 1 each do not fit what this Ray has free (CPU 2")
        and m.endswith("starting 2")
        for m in logs
    )
    assert any(m.startswith("2 encoder actor(s) on 1 node(s)") for m in logs)
