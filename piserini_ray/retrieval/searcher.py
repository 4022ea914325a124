"""BM25 search over a piserini_ray index: Anserini's searcher with a fast path for deep rankings.

pyserini's `LuceneSearcher.search(q, 1000)` spends most of its time outside Lucene: Anserini
loads each hit's stored document to read its docid, and pyjnius wraps every hit as a Python
object. `BM25Searcher` keeps the same pieces (the index reader and analyzer of the
`SimpleSearcher` that `LuceneSearcher` wraps: Anserini's default English analyzer,
`BagOfWordsQueryGenerator`, Lucene's `BM25Similarity`, Anserini's tie-break by docid and its
score rounding) and changes only the transport: the hits cross JNI once, as one string built by
a Java method handle, and Lucene ids map to docids through a table built at index time.
Rankings and scores are identical to `LuceneSearcher.search` (tested).

It opens the reader and the analyzer itself, as `SimpleSearcher(path)` does, and never touches
`SimpleSearcher`: pyjnius reflects a class's every method on first use, and that one's
signatures pull in most of Anserini (0.8 s of CPU in every replica's start, against 0.05 s for
the classes used here).

Queries are always bags of words analysed by Anserini's English analyzer, never parsed as Lucene
syntax, so no user text can fail to parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from piserini_ray.config import BM25Params, RetrievalConfig
from piserini_ray.retrieval.docstore import Docstore
from piserini_ray.retrieval.index import read_index_info
from piserini_ray.retrieval.jvm import autoclass, boot_jvm, cast, import_lucene_searcher

#: Lucene caps a boolean query at 1,024 clauses by default; a long pasted query must not fail.
MAX_CLAUSES = 1 << 16
_HIT = re.compile(r"doc=(\d+) score=(\S+)")
_F32 = np.float32


@dataclass(frozen=True)
class Ranking:
    """A ranked list: docstore ordinals best first, with Anserini-rounded BM25 scores."""

    ordinals: np.ndarray  # int32
    scores: np.ndarray  # float32

    def __len__(self) -> int:
        return len(self.ordinals)


def docid_pairs(ranking: Ranking, docids: list[str]) -> list[tuple[str, float]]:
    """A ranking as (docid, score) pairs, best first."""
    return [(docids[o], float(s)) for o, s in zip(ranking.ordinals, ranking.scores, strict=True)]


def anserini_tie_adjust(scores: np.ndarray) -> np.ndarray:
    """Anserini's ScoreTiesAdjusterReranker: round each float score to 1e-4 (in double
    precision, half up), then lower the k-th score of a tie run by k * 1e-6 so that scores
    sort in rank order. Java's float / double mix is reproduced so results match bit for bit."""
    rounded = (np.floor(scores.astype(np.float64) * 1e4 + 0.5) / 1e4).astype(np.float32)
    out = np.empty_like(rounded)
    dup = 0
    prev = _F32(0)
    for i, cur in enumerate(rounded):
        if i == 0 or float(prev - cur) > 1e-4:
            dup = 0
        else:
            dup += 1
            cur = _F32(float(cur) - 1e-6 * dup)
        out[i] = prev = cur
    return out


class BM25Searcher:
    """One searcher replica: a JVM-side index reader, BM25 settings and the docstore."""

    name = "bm25"

    def __init__(
        self, index_dir: Path, bm25: BM25Params = BM25Params(), depth: int = 1000, heap: str = "1g"
    ) -> None:
        boot_jvm(heap)
        self.index_dir = Path(index_dir)
        self.info = read_index_info(self.index_dir)
        self.depth = depth
        self.docstore = Docstore(self.index_dir)
        self._lucene_to_ordinal = np.load(self.index_dir / "lucene_to_ordinal.npy")
        autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(MAX_CLAUSES)
        # What `SimpleSearcher(path)` opens: the reader, and `IndexCollection.DEFAULT_ANALYZER`.
        directory = autoclass("org.apache.lucene.store.FSDirectory").open(
            autoclass("java.nio.file.Paths").get(str(self.index_dir / "lucene"))
        )
        self._reader = cast(  # as `SimpleSearcher.reader` is typed: `IndexSearcher(IndexReader)`
            "org.apache.lucene.index.IndexReader",
            autoclass("org.apache.lucene.index.DirectoryReader").open(directory),
        )
        self._analyzer = autoclass(
            "io.anserini.analysis.DefaultEnglishAnalyzer"
        ).newDefaultInstance()
        self._generator = autoclass("io.anserini.search.query.BagOfWordsQueryGenerator")()
        sort_field = autoclass("org.apache.lucene.search.SortField")
        sort_type = autoclass("org.apache.lucene.search.SortField$Type")
        # Anserini's BREAK_SCORE_TIES_BY_DOCID: score, then the stored docid (binary doc values).
        self._sort = autoclass("org.apache.lucene.search.Sort")(
            sort_field.FIELD_SCORE, sort_field("id", sort_type.STRING_VAL)
        )
        self._hits_to_string = _hits_to_string_handle()
        self._singleton = autoclass("java.util.Collections").singletonList
        self.set_bm25(bm25)

    @property
    def num_docs(self) -> int:
        return len(self.docstore)

    def set_bm25(self, bm25: BM25Params) -> None:
        """Re-score with other BM25 parameters (no index rebuild; cheap)."""
        similarity = autoclass("org.apache.lucene.search.similarities.BM25Similarity")(
            float(bm25.k1), float(bm25.b)
        )
        searcher = autoclass("org.apache.lucene.search.IndexSearcher")(self._reader)
        searcher.setSimilarity(similarity)
        # One assignment: a search running meanwhile sees the old or the new settings, whole.
        self._searcher, self.bm25 = searcher, bm25

    def search(self, text: str, k: int | None = None) -> Ranking:
        """The top `k` (default: the configured depth) documents for a bag-of-words query."""
        k = self.depth if k is None else k
        query = self._generator.buildQuery("contents", self._analyzer, text)
        top = self._searcher.search(query, k, self._sort, True)
        hits = _HIT.findall(self._hits_to_string.invokeWithArguments(self._singleton(top)))
        lucene_ids = np.fromiter((int(d) for d, _ in hits), dtype=np.int64, count=len(hits))
        scores = np.fromiter((float(s) for _, s in hits), dtype=np.float32, count=len(hits))
        return Ranking(self._lucene_to_ordinal[lucene_ids], anserini_tie_adjust(scores))

    def search_docids(self, text: str, k: int | None = None) -> list[tuple[str, float]]:
        return docid_pairs(self.search(text, k), self.docstore.docids)

    # The document side of the tools' `Backend` protocol, served from the docstore.
    def docid(self, ordinal: int) -> str:
        return self.docstore.docids[ordinal]

    def title(self, ordinal: int) -> str | None:
        return self.docstore.titles[ordinal]

    def contents(self, ordinal: int) -> str:
        return self.docstore.contents(ordinal)

    def ordinal(self, docid: str) -> int | None:
        return self.docstore.ordinal.get(docid)

    def close(self) -> None:
        self._reader.close()


def open_searcher(index_dir: Path, retrieval: RetrievalConfig) -> BM25Searcher:
    """A searcher with a run's BM25 parameters, depth and JVM heap."""
    return BM25Searcher(index_dir, retrieval.bm25, retrieval.depth, retrieval.jvm_heap)


def _hits_to_string_handle() -> Any:
    """A Java method handle `TopDocs -> Arrays.toString(topDocs.scoreDocs)`.

    Reading `scoreDocs` from Python would wrap each hit as a pyjnius object (~2.5 ms per 1000);
    the handle formats them on the Java side and returns one string.
    """
    klass = autoclass("java.lang.Class")
    handles = autoclass("java.lang.invoke.MethodHandles")
    method_type = autoclass("java.lang.invoke.MethodType")
    lookup = handles.publicLookup()
    score_docs = klass.forName("[Lorg.apache.lucene.search.ScoreDoc;")
    string = klass.forName("java.lang.String")
    getter = lookup.findGetter(
        klass.forName("org.apache.lucene.search.TopDocs"), "scoreDocs", score_docs
    )
    to_string = lookup.findStatic(
        klass.forName("java.util.Arrays"),
        "toString",
        method_type.methodType(string, klass.forName("[Ljava.lang.Object;")),
    ).asType(method_type.methodType(string, score_docs))
    return handles.filterReturnValue(getter, to_string)


class PyseriniReference:
    """pyserini's own `LuceneSearcher`, for comparisons in tests and benchmarks only."""

    def __init__(self, index_dir: Path, bm25: BM25Params = BM25Params()) -> None:
        self.searcher = import_lucene_searcher()(str(Path(index_dir) / "lucene"))
        self.searcher.set_bm25(float(bm25.k1), float(bm25.b))

    def search_docids(self, text: str, k: int = 1000) -> list[tuple[str, float]]:
        return [(h.docid, float(h.score)) for h in self.searcher.search(text, k)]
