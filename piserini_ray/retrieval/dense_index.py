"""The dense index of a corpus: document vectors from an encoder, searched with FAISS.

A dense index lives inside the Lucene index folder of its corpus, as `dense-{key}/` where the
key is `encoder.encoder_identity` (model files by content, pooling, normalisation, document
prefix and length), so a changed encoder never reads stale vectors. Its layout is pyserini's
(`index`: a FAISS `IndexFlatIP`; `docid`: one docid per row), so `FaissSearcher` opens it, plus
`dense.json`. Rows are docstore ordinals.

The build encodes shard by shard (`retrieval.dense.shard_size` documents each) into
`.dense-{key}.building/shards/NNNNN.npy`, each written whole (temp file, then rename), so an
interrupted build resumes at the first missing shard; the index is assembled once every shard
is there, and the folder renamed complete. Who encodes a shard is pluggable: this process
(`local_shard_encoder`) or encoder actors on Ray (`engines/ray/encoder_actors.py`).

A prebuilt index (`retrieval.dense.prebuilt_index`, e.g. one BrowseComp-Plus publishes) is
opened in place; its docids are mapped onto the docstore's ordinals.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from piserini_ray.config import DenseConfig
from piserini_ray.errors import IndexBuildError
from piserini_ray.retrieval.docstore import Docstore
from piserini_ray.retrieval.encoder import encoder_identity, encoder_label
from piserini_ray.retrieval.index import locked
from piserini_ray.retrieval.searcher import Ranking

DENSE_FORMAT = 1

#: (shard number, its documents' texts) in; (shard number, its vectors) out, in any order.
ShardEncoder = Callable[[Iterable[tuple[int, list[str]]]], Iterator[tuple[int, np.ndarray]]]


class DenseIndexInfo(BaseModel):
    format: int = DENSE_FORMAT
    encoder: str
    encoder_identity: str
    dim: int
    num_docs: int
    shards: int
    built_at: str
    build_seconds: float


def dense_index_dir(index_dir: Path, dense: DenseConfig, identity: str | None = None) -> Path:
    """Where the dense index of this Lucene index and encoder lives (or the prebuilt one);
    `identity`: the encoder's, if the caller has it already."""
    if dense.prebuilt_index is not None:
        return dense.prebuilt_index
    return index_dir / f"dense-{(identity or encoder_identity(dense))[:16]}"


def shard_ranges(num_docs: int, shard_size: int) -> list[tuple[int, int]]:
    return [(s, min(s + shard_size, num_docs)) for s in range(0, num_docs, shard_size)]


def local_shard_encoder(dense: DenseConfig) -> ShardEncoder:
    """Shards encoded in this process, with one model loaded on first use."""

    def encode(shards: Iterable[tuple[int, list[str]]]) -> Iterator[tuple[int, np.ndarray]]:
        from piserini_ray.retrieval.encoder import TextEncoder

        encoder: TextEncoder | None = None
        for number, texts in shards:
            encoder = encoder or TextEncoder(dense)
            yield number, encoder.encode_documents(texts)

    return encode


def find_dense_index(index_dir: Path, dense: DenseConfig) -> Path | None:
    path = dense_index_dir(index_dir, dense)
    return path if (path / "index").exists() and (path / "docid").exists() else None


def build_dense_index(
    index_dir: Path,
    dense: DenseConfig,
    encode: ShardEncoder | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> Path:
    """The dense index of the Lucene index at `index_dir`, built first if needed."""
    if dense.prebuilt_index is not None:
        return _check_prebuilt(dense.prebuilt_index)
    identity = encoder_identity(dense)
    final = dense_index_dir(index_dir, dense, identity)
    if (final / "dense.json").exists():
        return final
    waiting = f"another process is building {final}; waiting for it"
    with locked(index_dir.parent / f".{index_dir.name}.{final.name}.lock", lambda: log(waiting)):
        if (final / "dense.json").exists():
            return final
        started = time.monotonic()
        building = final.with_name(f".{final.name}.building")
        shards = building / "shards"
        shards.mkdir(parents=True, exist_ok=True)
        docstore = Docstore(index_dir)
        ranges = shard_ranges(len(docstore), dense.shard_size)
        missing = [i for i in range(len(ranges)) if not _shard_path(shards, i).exists()]
        log(
            f"dense index of {len(docstore)} documents with {encoder_label(dense)}: "
            f"{len(ranges)} shard(s), {len(ranges) - len(missing)} done before, "
            f"{len(missing)} to encode"
        )

        def texts() -> Iterator[tuple[int, list[str]]]:
            for i in missing:
                start, end = ranges[i]
                yield i, [docstore.contents(o) for o in range(start, end)]

        done = len(ranges) - len(missing)
        for number, vectors in (encode or local_shard_encoder(dense))(texts()):
            start, end = ranges[number]
            if vectors.shape[0] != end - start:
                raise IndexBuildError(
                    f"shard {number} came back with {vectors.shape[0]} vectors for "
                    f"{end - start} documents"
                )
            _write_shard(shards, number, vectors)
            done += 1
            log(f"dense index: shard {done}/{len(ranges)} encoded")
        dim = _assemble(building, shards, len(ranges), docstore.docids)
        info = DenseIndexInfo(
            encoder=encoder_label(dense),
            encoder_identity=identity,
            dim=dim,
            num_docs=len(docstore),
            shards=len(ranges),
            built_at=datetime.now(UTC).isoformat(timespec="seconds"),
            build_seconds=round(time.monotonic() - started, 2),
        )
        (building / "dense.json").write_text(info.model_dump_json(indent=2))
        shutil.rmtree(shards)
        shutil.rmtree(final, ignore_errors=True)
        building.rename(final)
        log(f"dense index ready: {final} ({info.num_docs} vectors of {info.dim} dims)")
        return final


def _shard_path(shards: Path, number: int) -> Path:
    return shards / f"{number:05d}.npy"


def _write_shard(shards: Path, number: int, vectors: np.ndarray) -> None:
    tmp = shards / f".{number:05d}.npy.tmp"
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(vectors, dtype=np.float32))
    tmp.replace(_shard_path(shards, number))


def _assemble(building: Path, shards: Path, count: int, docids: list[str]) -> int:
    """The FAISS index and docid table from every shard, in order; the vectors' dimension."""
    import faiss

    vectors = np.concatenate([np.load(_shard_path(shards, i)) for i in range(count)])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(building / "index"))
    (building / "docid").write_text("".join(f"{d}\n" for d in docids))
    return int(vectors.shape[1])


def _check_prebuilt(path: Path) -> Path:
    missing = [name for name in ("index", "docid") if not (path / name).exists()]
    if missing:
        raise IndexBuildError(
            f"retrieval.dense.prebuilt_index {path} lacks {' and '.join(missing)}: give a "
            "folder in pyserini's FAISS layout (a FAISS index file `index` and a `docid` file "
            "with one docid per row)"
        )
    return path


class DenseIndex:
    """A dense index in pyserini's layout, ranking docstore ordinals.

    Searched as pyserini's `FaissSearcher.search` searches it (the same `faiss.read_index`, the
    same `index.search`, hits of row -1 dropped), and tested equal to it; but without importing
    pyserini's FAISS module, which pulls torch and transformers into every replica (a dense
    replica would hold twice a BM25 one's memory for a model it never runs).
    """

    def __init__(self, path: Path, docstore: Docstore) -> None:
        import faiss

        self.path = path
        self.index: Any = faiss.read_index(str(path / "index"))
        self.dim = int(self.index.d)
        with open(path / "docid") as f:  # FaissSearcher.load_docids
            rows = [line.rstrip() for line in f]
        if len(rows) != self.index.ntotal:
            raise IndexBuildError(
                f"dense index {path} has {self.index.ntotal} vectors but {len(rows)} docids: "
                "the folder is damaged; rebuild it"
            )
        unknown = [d for d in rows if d not in docstore.ordinal]
        if unknown:
            raise IndexBuildError(
                f"dense index {path} holds {len(unknown)} docid(s) the corpus lacks (e.g. "
                f"{unknown[0]!r}): it was built from another corpus; build it from this one "
                "(`piserini-ray index --backend dense`) or point prebuilt_index at the right one"
            )
        self.row_to_ordinal = np.fromiter(
            (docstore.ordinal[d] for d in rows), dtype=np.int32, count=len(rows)
        )
        self.ordinal_to_row = np.full(len(docstore), -1, dtype=np.int64)
        self.ordinal_to_row[self.row_to_ordinal] = np.arange(len(rows))

    @property
    def num_vectors(self) -> int:
        return int(self.index.ntotal)

    def search(self, vector: np.ndarray, k: int) -> Ranking:
        """The `k` nearest documents by inner product (cosine on normalised vectors)."""
        if vector.shape[-1] != self.dim:
            raise IndexBuildError(
                f"the query encoder gives {vector.shape[-1]}-dim vectors but dense index "
                f"{self.path} holds {self.dim}-dim ones: use the encoder the index was built with"
            )
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        distances, rows = self.index.search(query, min(k, self.num_vectors))
        found = rows[0] != -1
        return Ranking(self.row_to_ordinal[rows[0][found]], distances[0][found].astype(np.float32))

    def vectors(self, ordinals: np.ndarray) -> np.ndarray:
        """The stored vectors of these documents (zeros for one the index lacks)."""
        rows = self.ordinal_to_row[ordinals]
        out = np.zeros((len(ordinals), self.dim), dtype=np.float32)
        present = rows >= 0
        if present.any():
            try:
                out[present] = self.index.reconstruct_batch(rows[present])
            except RuntimeError as e:
                raise IndexBuildError(
                    f"dense index {self.path} cannot return stored vectors ({e}); reranking "
                    "needs a flat FAISS index"
                ) from None
        return out
