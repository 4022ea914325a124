"""Dense, hybrid and rerank retrieval over the sample: a real FAISS index built from the real
encoder, checked against pyserini's encoders and an independent numpy computation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from piserini_ray.config import DenseConfig, RetrievalConfig, load_config
from piserini_ray.errors import ConfigError, IndexBuildError
from piserini_ray.retrieval.backends import open_backend
from piserini_ray.retrieval.dense_index import DenseIndex, build_dense_index, find_dense_index
from piserini_ray.retrieval.encoder import EncoderError, TextEncoder, resolve_encoder_dir
from piserini_ray.tools import ToolSession

pytestmark = pytest.mark.slow  # dense index builds of the sample (45-50 s each)

QUERIES = 6


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder(DenseConfig())


@pytest.fixture(scope="module")
def backends(sample_index: Path, dense_sample: Path, searcher, encoder):
    """Every backend over the sample, sharing one BM25 searcher and one query encoder."""

    def encode(text: str) -> np.ndarray:
        return encoder.encode_queries([text])[0]

    return {
        name: open_backend(sample_index, RetrievalConfig(backend=name), encode, bm25=searcher)
        for name in ("bm25", "dense", "hybrid", "rerank")
    }


def _stored_vectors(dense_sample: Path, searcher) -> np.ndarray:
    index = DenseIndex(dense_sample, searcher.docstore)
    return index.index.reconstruct_n(0, index.num_vectors)


def test_our_encoder_gives_pyserinis_vectors(sample, encoder, searcher) -> None:
    # pyserini's package boots the JVM on import (the searcher fixture did) and builds an
    # OpenAI client, which needs a key: a placeholder, as for the Lucene searcher.
    from piserini_ray.retrieval.jvm import placeholder_openai_key

    with placeholder_openai_key():
        from pyserini.encode import AutoDocumentEncoder, AutoQueryEncoder

    folder = str(resolve_encoder_dir(None))
    docs = [d.contents() for d in list(sample.corpus)[:8]]
    theirs = AutoDocumentEncoder(folder, device="cpu", pooling="mean", l2_norm=True)
    np.testing.assert_allclose(
        encoder.encode_documents(docs), theirs.encode(docs, max_length=256), atol=2e-5
    )
    query_encoder = AutoQueryEncoder(folder, device="cpu", pooling="mean", l2_norm=True)
    for query in sample.queries[:4]:
        ours = encoder.encode_queries([query.query])[0]
        np.testing.assert_allclose(
            ours, query_encoder.encode(query.query, max_length=128), atol=2e-5
        )


def test_the_index_holds_each_documents_own_vector(dense_sample, searcher, encoder) -> None:
    vectors = _stored_vectors(dense_sample, searcher)
    assert vectors.shape == (searcher.num_docs, encoder.dim)
    picks = [0, 17, searcher.num_docs - 1]
    fresh = encoder.encode_documents([searcher.contents(o) for o in picks])
    np.testing.assert_allclose(vectors[picks], fresh, atol=2e-5)
    assert (dense_sample / "docid").read_text().split("\n")[:3] == searcher.docstore.docids[:3]


def test_faiss_search_equals_brute_force_numpy(sample, backends, dense_sample, searcher) -> None:
    vectors = _stored_vectors(dense_sample, searcher).astype(np.float64)
    dense = backends["dense"]
    for query in sample.queries[:QUERIES]:
        ranking = dense.search(query.query)
        scores = vectors @ dense.encode_query(query.query).astype(np.float64)
        assert len(ranking) == 1000
        # The same scores in the same order; ordinals agree wherever scores are not tied.
        expected = np.sort(scores)[::-1][:1000]
        np.testing.assert_allclose(ranking.scores, expected, atol=1e-5)
        np.testing.assert_allclose(scores[ranking.ordinals], ranking.scores, atol=1e-5)
        assert ranking.ordinals[0] == int(np.argmax(scores))


def test_dense_search_equals_pyserinis_faiss_searcher(sample, backends, dense_sample) -> None:
    from piserini_ray.retrieval.jvm import import_faiss_searcher

    theirs = import_faiss_searcher()(str(dense_sample), query_encoder=None)
    dense = backends["dense"]
    for query in sample.queries[:QUERIES]:
        vector = dense.encode_query(query.query).reshape(1, -1)
        expected = [(h.docid, float(h.score)) for h in theirs.search(vector, k=1000)]
        assert dense.search_docids(query.query) == expected


def _by_score_then_docid(scores: dict[str, float], k: int) -> list[str]:
    return [d for d, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def _minmax(values: dict[str, float]) -> dict[str, float]:
    low, high = min(values.values()), max(values.values())
    return {d: (v - low) / (high - low) if high > low else 1.0 for d, v in values.items()}


def test_hybrid_and_rerank_equal_an_independent_computation(
    sample, backends, dense_sample, searcher
) -> None:
    vectors = _stored_vectors(dense_sample, searcher).astype(np.float64)
    docids = searcher.docstore.docids
    dense = backends["dense"]
    for query in sample.queries[:QUERIES]:
        bm25 = dict(searcher.search_docids(query.query, 1000))
        bm25_order = [d for d, _ in searcher.search_docids(query.query, 1000)]
        similarity = vectors @ dense.encode_query(query.query).astype(np.float64)
        top = np.argsort(-similarity, kind="stable")[:1000]
        dense_scores = {docids[o]: float(similarity[o]) for o in top}
        dense_order = [docids[o] for o in top]
        # Reciprocal rank fusion with k = 60.
        rrf: dict[str, float] = {}
        for order in (bm25_order, dense_order):
            for rank, d in enumerate(order, start=1):
                rrf[d] = rrf.get(d, 0.0) + 1 / (60 + rank)
        got = [d for d, _ in backends["hybrid"].search_docids(query.query)]
        assert got == _by_score_then_docid(rrf, 1000)
        # Rerank: the same BM25 set, ordered by cosine.
        rerank = {d: float(similarity[searcher.ordinal(d)]) for d in bm25}
        got = [d for d, _ in backends["rerank"].search_docids(query.query)]
        assert set(got) == set(bm25) and got == _by_score_then_docid(rerank, 1000)
        # Linear fusion, alpha 0.3 on the dense side, min-max normalised, absent side 0.
        linear = RetrievalConfig(backend="hybrid", hybrid={"fusion": "linear", "alpha": 0.3})
        fused = open_backend(
            dense_sample.parent, linear, dense.encode_query, bm25=searcher
        ).search_docids(query.query)
        nb, nd = _minmax(bm25), _minmax(dense_scores)
        expected = {d: 0.7 * nb.get(d, 0.0) + 0.3 * nd.get(d, 0.0) for d in set(nb) | set(nd)}
        assert [d for d, _ in fused] == _by_score_then_docid(expected, 1000)


def test_rerank_interpolated_with_bm25(sample, backends, dense_sample, searcher) -> None:
    vectors = _stored_vectors(dense_sample, searcher).astype(np.float64)
    retrieval = RetrievalConfig(backend="rerank", rerank={"alpha": 0.5})
    rerank = open_backend(
        dense_sample.parent, retrieval, backends["dense"].encode_query, bm25=searcher
    )
    query = sample.queries[0].query
    bm25 = dict(searcher.search_docids(query, 1000))
    vector = rerank.encode_query(query)
    cosine = {d: float(vectors[searcher.ordinal(d)] @ vector) for d in bm25}
    nb, nc = _minmax(bm25), _minmax(cosine)
    expected = {d: 0.5 * nc[d] + 0.5 * nb[d] for d in bm25}
    assert [d for d, _ in rerank.search_docids(query)] == _by_score_then_docid(expected, 1000)


@pytest.mark.parametrize("name", ["bm25", "dense", "hybrid", "rerank"])
def test_the_three_tools_over_each_backend(name, sample, backends) -> None:
    backend = backends[name]
    session = ToolSession(backend)
    query = sample.queries[1].query
    result = session.call("search", {"reason": "r", "query": query})
    assert result.ok and "1000 hits cached. Showing ranks 1-5." in result.output
    ranking = [d for d, _ in backend.search_docids(query)]
    assert f"[1] docid: {ranking[0]} |" in result.output
    page = session.call("read_search_results", {"reason": "r", "search_id": "s1", "offset": 996})
    assert page.ok and "ranks 996-1000 of 1000" in page.output
    assert f"[1000] docid: {ranking[999]} |" in page.output
    doc = session.call("read_document", {"reason": "r", "docid": ranking[0]})
    assert doc.ok and backend.contents(backend.ordinal(ranking[0])).splitlines()[0] in doc.output
    assert list(session.surfaced) == ranking and list(session.opened) == [ranking[0]]
    assert backend.name == name


def test_a_half_built_dense_index_resumes_at_the_first_missing_shard(
    small_corpus, tmp_path
) -> None:
    from piserini_ray.data.loaders import jsonl_corpus
    from piserini_ray.retrieval import build_index
    from piserini_ray.retrieval.dense_index import local_shard_encoder

    index = build_index(jsonl_corpus(small_corpus, name="small"), tmp_path / "indexes")
    dense = DenseConfig(shard_size=8)  # 40 documents: 5 shards
    encoded: list[int] = []

    def dies_after_two(shards):
        for number, vectors in local_shard_encoder(dense)(shards):
            if len(encoded) == 2:
                raise KeyboardInterrupt  # the build is stopped mid-way
            encoded.append(number)
            yield number, vectors

    with pytest.raises(KeyboardInterrupt):
        build_dense_index(index, dense, dies_after_two)
    assert find_dense_index(index, dense) is None
    (building,) = index.glob(".dense-*.building")
    assert sorted(p.name for p in (building / "shards").glob("*.npy")) == ["00000.npy", "00001.npy"]
    encoded.clear()
    logs: list[str] = []

    def counting(shards):
        for number, vectors in local_shard_encoder(dense)(shards):
            encoded.append(number)
            yield number, vectors

    path = build_dense_index(index, dense, counting, logs.append)
    assert encoded == [2, 3, 4]
    assert any("5 shard(s), 2 done before, 3 to encode" in m for m in logs)
    assert not building.exists() and find_dense_index(index, dense) == path
    # The resumed index equals one built in one go.
    from piserini_ray.retrieval.docstore import Docstore

    vectors = DenseIndex(path, Docstore(index)).index.reconstruct_n(0, 40)
    texts = [Docstore(index).contents(o) for o in range(40)]
    np.testing.assert_allclose(vectors, TextEncoder(dense).encode_documents(texts), atol=2e-5)


def test_a_changed_encoder_setting_names_another_dense_index(sample_index) -> None:
    from piserini_ray.retrieval.dense_index import dense_index_dir

    base = dense_index_dir(sample_index, DenseConfig())
    assert dense_index_dir(sample_index, DenseConfig(doc_max_length=128)) != base
    assert dense_index_dir(sample_index, DenseConfig(batch_size=4, device="cpu")) == base


#: The default (BM25) config's hash before backends existed (session 4's runs are named by it).
HASH_BEFORE_BACKENDS = "566fc1123f8b5d5c"


def test_identity_counts_only_what_the_backend_uses() -> None:
    base = load_config(None)
    assert base.config_hash() == HASH_BEFORE_BACKENDS
    assert load_config(None, {"retrieval.dense.doc_max_length": 64}).config_hash() == (
        base.config_hash()
    )  # BM25 ignores the dense settings: its hash is the one before backends existed
    dense = load_config(None, {"retrieval.backend": "dense"})
    assert dense.config_hash() != base.config_hash()
    assert (
        load_config(
            None, {"retrieval.backend": "dense", "retrieval.dense.batch_size": 4}
        ).config_hash()
        == dense.config_hash()
    )
    assert (
        load_config(
            None, {"retrieval.backend": "dense", "retrieval.hybrid.alpha": 0.9}
        ).config_hash()
        == dense.config_hash()
    )
    assert (
        load_config(
            None, {"retrieval.backend": "dense", "retrieval.dense.query_prefix": "query:"}
        ).config_hash()
        != dense.config_hash()
    )


def test_bad_encoder_and_index_inputs_say_what_to_do(
    tmp_path, sample_index, searcher, monkeypatch
) -> None:
    import socket

    attempts: list[object] = []

    def no_network(*args: object, **kwargs: object) -> None:
        attempts.append(args)  # every fetch starts with a name lookup
        raise OSError("network used")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    with pytest.raises(EncoderError, match="neither a folder nor a model in the local"):
        resolve_encoder_dir("nobody/no-such-model")
    assert attempts == []  # a missing model is never fetched, not even tried
    (tmp_path / "empty").mkdir()
    with pytest.raises(EncoderError, match=r"without config\.json"):
        resolve_encoder_dir(str(tmp_path / "empty"))
    with pytest.raises(IndexBuildError, match="lacks index and docid"):
        build_dense_index(sample_index, DenseConfig(prebuilt_index=tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"retrieval\.backend"):
        load_config(None, {"retrieval.backend": "splade"})


def test_a_prebuilt_index_from_another_corpus_is_refused(tmp_path, dense_sample, searcher) -> None:
    import shutil

    prebuilt = tmp_path / "prebuilt"
    shutil.copytree(dense_sample, prebuilt)
    lines = (prebuilt / "docid").read_text().splitlines()
    (prebuilt / "docid").write_text("\n".join(["not-in-this-corpus", *lines[1:]]) + "\n")
    with pytest.raises(IndexBuildError, match="holds 1 docid\\(s\\) the corpus lacks"):
        DenseIndex(prebuilt, searcher.docstore)
    shutil.copy(dense_sample / "docid", prebuilt / "docid")
    assert DenseIndex(prebuilt, searcher.docstore).num_vectors == searcher.num_docs
