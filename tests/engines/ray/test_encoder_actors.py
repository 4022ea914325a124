"""Encoder actors on real Ray: batched query encoding, a dense index built by two encoder
actors on a two-node cluster, and a dense run whose replicas use their node's encoder (the
backends sweep runs in test_scheduler.py, on that module's Ray)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from piserini_ray.config import DenseConfig, load_config
from piserini_ray.retrieval.encoder import TextEncoder

pytestmark = pytest.mark.slow  # two-node dense runs: the dense sample index and encoder actors

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 << 20},
    )
    cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_concurrent_query_encodings_are_batched(two_nodes) -> None:
    import ray

    from piserini_ray.engines.ray.encoder_actors import EncoderActor

    dense = DenseConfig(batch_wait=0.5)
    actor = EncoderActor.remote(dense)
    texts = [f"who founded city number {i}" for i in range(12)]
    vectors = np.stack(ray.get([actor.encode_query.remote(t) for t in texts]))
    np.testing.assert_allclose(vectors, TextEncoder(dense).encode_queries(texts), atol=2e-5)
    batches = ray.get(actor.info.remote())["batches"]
    assert sum(batches) == 12 and len(batches) < 12  # concurrent requests shared forward passes


def test_two_encoder_actors_on_two_nodes_build_the_dense_index(two_nodes, small_corpus, tmp_path):
    from piserini_ray.data.loaders import jsonl_corpus
    from piserini_ray.engines.ray.encoder_actors import ray_shard_encoder
    from piserini_ray.retrieval import build_index
    from piserini_ray.retrieval.dense_index import DenseIndex, build_dense_index
    from piserini_ray.retrieval.docstore import Docstore

    index = build_index(jsonl_corpus(small_corpus, name="small"), tmp_path / "indexes")
    dense = DenseConfig(shard_size=5, build_actors=2)
    logs: list[str] = []
    path = build_dense_index(index, dense, ray_shard_encoder(dense, logs.append), logs.append)
    assert any("2 encoder actor(s) on 2 node(s)" in m for m in logs), logs
    assert any("shard 8/8 encoded" in m for m in logs)
    docstore = Docstore(index)
    stored = DenseIndex(path, docstore).index.reconstruct_n(0, len(docstore))
    texts = [docstore.contents(o) for o in range(len(docstore))]
    np.testing.assert_allclose(stored, TextEncoder(dense).encode_documents(texts), atol=2e-5)


def test_a_dense_run_on_two_nodes_uses_each_nodes_encoder(
    two_nodes, sample_index, dense_sample, index_root, tmp_path
) -> None:
    from piserini_ray.pipeline import run_on_ray

    config = load_config(
        None,
        {
            "retrieval.index_root": str(index_root),
            "retrieval.backend": "dense",
            "slice.sample": 4,
            "runtime.address": two_nodes.address,
            "runtime.replicas": 2,
            "runtime.cpus_per_replica": 0.5,
            "runtime.placement": "spread",
        },
    )
    logs: list[str] = []
    (summary,) = run_on_ray([(config, tmp_path / "run")], logs.append)
    assert summary.statuses == {"completed": 4}
    assert any("query encoders ready on 2 node(s)" in m for m in logs), logs
    assert any("2 searcher replica(s) ready on 2 node(s)" in m for m in logs), logs
    lines = (tmp_path / "run" / "records.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    rankings = [r for record in records for r in record["rankings"]]
    assert rankings and {r["backend"] for r in rankings} == {"dense"}
    assert all(len(r["docids"]) == 1000 for r in rankings)
