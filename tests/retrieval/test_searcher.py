import pytest
from conftest import LUCENE_SPECIALS

from piserini_ray.config import BM25_PRESETS, BM25Params
from piserini_ray.data import Benchmark
from piserini_ray.retrieval import BM25Searcher
from piserini_ray.retrieval.searcher import PyseriniReference, anserini_tie_adjust


@pytest.mark.parametrize("preset", ["piserini", "pyserini-default"])
def test_rankings_identical_to_pyserini_lucene_searcher(
    searcher: BM25Searcher, sample_index, sample: Benchmark, preset: str
) -> None:
    bm25 = BM25_PRESETS[preset]
    reference = PyseriniReference(sample_index, bm25)
    searcher.set_bm25(bm25)
    try:
        queries = [q.query for q in sample.queries]
        queries += [w for q in sample.queries for w in q.query.split()[:2]]  # short, many ties
        for text in queries:
            assert searcher.search_docids(text) == reference.search_docids(text, 1000), text
    finally:
        searcher.set_bm25(BM25Params())


@pytest.mark.parametrize("text", LUCENE_SPECIALS)
def test_no_query_text_fails_and_each_matches_pyserini(
    searcher: BM25Searcher, sample_index, text: str
) -> None:
    """Every text parses, as the bag of words pyserini's `LuceneSearcher` makes of it: the same
    hits and scores (Lucene's query syntax never reaches a parser)."""
    reference = PyseriniReference(sample_index, BM25Params())
    assert searcher.search_docids(text) == reference.search_docids(text, 1000)


def test_syntax_is_treated_as_words(searcher: BM25Searcher) -> None:
    plain = searcher.search_docids("Journal psychotherapy integration")
    syntax = searcher.search_docids('title:"Journal" AND (psychotherapy OR integration)*')
    # `title`, `and`, `or` are extra words (and/or are stop words); the top hit is the same.
    assert plain[0][0] == syntax[0][0] == "msq-7976b1e35e0a"
    assert searcher.search_docids("?!.,;:()") == []


def test_queries_beyond_lucenes_clause_limit(searcher: BM25Searcher) -> None:
    long_query = " ".join(f"term{i}" for i in range(5000)) + " psychotherapy"
    assert searcher.search_docids(long_query)[0][0] == "msq-7976b1e35e0a"


def test_depth_and_ordering(searcher: BM25Searcher) -> None:
    ranking = searcher.search("journal", k=7)
    assert len(ranking) == 7
    assert all(ranking.scores[i] > ranking.scores[i + 1] for i in range(6))
    assert len(searcher.search("first american city state world year war born")) == 1000


def test_bm25_parameters_change_the_scores(searcher: BM25Searcher) -> None:
    a = searcher.search_docids("journal published")
    searcher.set_bm25(BM25_PRESETS["pyserini-default"])
    try:
        b = searcher.search_docids("journal published")
    finally:
        searcher.set_bm25(BM25Params())
    assert a != b


def test_tie_adjustment_matches_anserini_rules() -> None:
    import numpy as np

    raw = np.array([2.00004, 1.5, 1.5, 1.5, 1.49995, 1.0], dtype=np.float32)
    adjusted = anserini_tie_adjust(raw)
    expected = [2.0, 1.5, 1.499999, 1.499998, 1.499997, 1.0]  # 1.49995 rounds to 1.5: a tie
    assert np.allclose(adjusted, np.array(expected, dtype=np.float32), atol=1e-7)
    assert all(adjusted[i] > adjusted[i + 1] for i in range(5))
