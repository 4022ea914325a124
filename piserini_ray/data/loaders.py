"""Loaders for the three benchmark sources of docs/spec.md §1: plain JSONL + TREC qrels,
BrowseComp-Plus from local files, and the embedded MuSiQue sample.

Every malformed input raises `DataError` naming the file, the line and the problem.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from piserini_ray.config import BenchmarkConfig
from piserini_ray.data.benchmark import Benchmark, Corpus, Document, Qrels, Query, iter_nonempty
from piserini_ray.data.obfuscation import DeobfuscationError, deobfuscate_record
from piserini_ray.errors import DataError, describe_validation_error

SAMPLE_NAME = "musique-sample"


def sample_dir() -> Path:
    """The folder of the embedded MuSiQue sample inside the installed package."""
    return Path(str(resources.files("piserini_ray.data") / "sample"))


# ---------------------------------------------------------------- qrels


def read_qrels(path: Path) -> Qrels:
    """TREC qrels: `qid Q0 docid rel` per line (the second column is ignored)."""
    qrels: Qrels = {}
    for number, line in _read_lines(path):
        parts = line.split()
        if len(parts) != 4:
            raise DataError(
                path, f"expected 4 columns 'qid Q0 docid rel', found {len(parts)}", number
            )
        qid, _, docid, rel = parts
        try:
            qrels.setdefault(qid, {})[docid] = int(rel)
        except ValueError:
            raise DataError(path, f"relevance {rel!r} is not an integer", number) from None
    return qrels


# ---------------------------------------------------------------- JSONL


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a bad line raises `DataError`."""
    for number, line in _read_lines(path):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise DataError(path, f"not valid JSON ({e})", number) from None
        if not isinstance(obj, dict):
            raise DataError(path, f"expected a JSON object, found {type(obj).__name__}", number)
        yield number, obj


def read_queries_jsonl(path: Path) -> list[Query]:
    """Queries `{"query_id", "query", "answer"}` (optional `aliases`, `stratum`)."""
    queries = []
    for number, obj in read_jsonl(path):
        if isinstance(obj.get("query_id"), int):
            obj["query_id"] = str(obj["query_id"])
        queries.append(_validated(Query, obj, path, number))
    if not queries:
        raise DataError(path, "query file holds no queries")
    return queries


def jsonl_corpus(path: Path, name: str | None = None) -> Corpus:
    """Corpus `{"docid", "text"}` per line (optional `title`, `url`; other fields ignored)."""
    path = _existing(path, "corpus")

    def reader() -> Iterator[Document]:
        return _unique_documents(_document(obj, path, number) for number, obj in read_jsonl(path))

    return Corpus(name=name or f"jsonl:{path.name}", files=(path,), reader=reader)


# ---------------------------------------------------------------- BrowseComp-Plus


def _read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a parquet or JSONL file, numbered from 1."""
    path = _existing(path, "data")
    if path.suffix != ".parquet":
        yield from read_jsonl(path)
        return
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise DataError(path, f"not a readable parquet file ({e})") from None
    number = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def read_browsecomp_plus_queries(
    path: Path, canary: str | None, obfuscated: bool
) -> tuple[list[Query], Qrels, Qrels]:
    """Queries plus the evidence / gold doc lists the published rows carry."""
    queries: list[Query] = []
    evidence: Qrels = {}
    gold: Qrels = {}
    for number, row in _read_rows(path):
        if obfuscated:
            if canary is None:
                raise DataError(path, "the file is obfuscated: set benchmark.canary")
            try:
                row = deobfuscate_record(row, canary)
            except DeobfuscationError as e:
                raise DataError(
                    path, f"cannot de-obfuscate: {e} (check benchmark.canary)", number
                ) from None
        qid = str(row.get("query_id", ""))
        queries.append(
            _validated(
                Query,
                {"query_id": qid, "query": row.get("query"), "answer": row.get("answer")},
                path,
                number,
            )
        )
        for key, target in (("evidence_docs", evidence), ("gold_docs", gold)):
            docs = row.get(key) or []
            target[qid] = {str(d["docid"]): 1 for d in docs if isinstance(d, dict) and "docid" in d}
    return queries, evidence, gold


def browsecomp_plus_corpus(path: Path) -> Corpus:
    path = _existing(path, "corpus")

    def reader() -> Iterator[Document]:
        return _unique_documents(_document(row, path, number) for number, row in _read_rows(path))

    return Corpus(name=f"browsecomp-plus:{path.name}", files=(path,), reader=reader)


# ---------------------------------------------------------------- entry point


def load_corpus(cfg: BenchmarkConfig) -> Corpus:
    """The corpus a config names, without reading (or de-obfuscating) any query: building an
    index needs only this, so a node can index before the canary is filled in."""
    if cfg.source == "sample":
        return jsonl_corpus(sample_dir() / "corpus.jsonl", name=SAMPLE_NAME)
    assert cfg.corpus is not None  # checked by BenchmarkConfig
    if cfg.source == "jsonl":
        return jsonl_corpus(cfg.corpus)
    return browsecomp_plus_corpus(cfg.corpus)


def load_benchmark(cfg: BenchmarkConfig) -> Benchmark:
    """Load the benchmark a config names."""
    corpus = load_corpus(cfg)
    if cfg.source == "sample":
        root = sample_dir()
        return Benchmark(
            name=cfg.name or SAMPLE_NAME,
            queries=read_queries_jsonl(root / "queries.jsonl"),
            evidence=read_qrels(root / "qrels_evidence.txt"),
            gold=read_qrels(root / "qrels_gold.txt"),
            corpus=corpus,
        )
    assert cfg.queries is not None  # checked by BenchmarkConfig
    if cfg.source == "jsonl":
        queries = read_queries_jsonl(cfg.queries)
        evidence: Qrels = {}
        gold: Qrels = {}
    else:
        queries, evidence, gold = read_browsecomp_plus_queries(
            cfg.queries, cfg.canary, cfg.obfuscated
        )
    # Qrels files, when given, take precedence over doc lists carried in the query rows.
    if cfg.qrels_evidence is not None:
        evidence = read_qrels(cfg.qrels_evidence)
    if cfg.qrels_gold is not None:
        gold = read_qrels(cfg.qrels_gold)
    return Benchmark(
        name=cfg.display_name(), queries=queries, evidence=evidence, gold=gold, corpus=corpus
    )


# ---------------------------------------------------------------- helpers


def _existing(path: Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(path, f"{what} file does not exist (check the path in your config)")
    return path


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    path = _existing(path, "input")
    with open(path, encoding="utf-8") as f:
        try:
            yield from iter_nonempty(f)
        except UnicodeDecodeError as e:
            raise DataError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def _unique_documents(docs: Iterator[tuple[Document, Path, int]]) -> Iterator[Document]:
    """The documents, refusing a docid seen before (naming both lines: the index and the
    recall metrics need one document per id)."""
    first_line: dict[str, int] = {}
    for doc, path, number in docs:
        if doc.docid in first_line:
            raise DataError(
                path,
                f"docid {doc.docid!r} appears twice (first on line {first_line[doc.docid]}); "
                "give each document its own id or drop the duplicate",
                number,
            )
        first_line[doc.docid] = number
        yield doc


def _document(obj: dict[str, Any], path: Path, number: int) -> tuple[Document, Path, int]:
    fields = {k: obj.get(k) for k in ("docid", "text", "title", "url") if obj.get(k) is not None}
    if isinstance(fields.get("docid"), int):
        fields["docid"] = str(fields["docid"])
    return _validated(Document, fields, path, number), path, number


def _validated(model: type[BaseModel], obj: dict[str, Any], path: Path, number: int) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise DataError(path, describe_validation_error(e), number) from None
