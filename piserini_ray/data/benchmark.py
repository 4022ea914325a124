"""The benchmark model: queries, evidence and gold qrels, and a streamed corpus
(docs/spec.md §1)."""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from piserini_ray.errors import DataError

#: qrels: query id -> {docid: relevance}
Qrels = dict[str, dict[str, int]]


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    query_id: str = Field(min_length=1)
    query: str
    answer: str
    #: Other accepted spellings of the answer (used by the offline exact-match judge).
    aliases: tuple[str, ...] = ()
    #: Optional label for stratified sampling (e.g. the hop count of a MuSiQue question).
    stratum: str | None = None


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    docid: str = Field(min_length=1)
    text: str
    title: str | None = None
    url: str | None = None

    def contents(self) -> str:
        """What is indexed and what `read_document` shows: the title line, then the text."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True)
class Corpus:
    """A corpus that is streamed, never held whole in memory (BrowseComp-Plus is ~3 GB of text).

    `files` are the files the documents come from: their content is what `fingerprint` hashes.
    """

    name: str
    files: tuple[Path, ...]
    reader: Callable[[], Iterator[Document]]

    def __iter__(self) -> Iterator[Document]:
        return self.reader()

    def fingerprint(self) -> str:
        """SHA-256 over the files' bytes and the reader's name: the key of an index."""
        h = hashlib.sha256(self.name.encode())
        for path in self.files:
            h.update(b"\0" + path.name.encode() + b"\0")
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        return h.hexdigest()


@dataclass
class Benchmark:
    name: str
    queries: list[Query]
    evidence: Qrels
    gold: Qrels
    corpus: Corpus
    _by_id: dict[str, Query] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_id = {}
        for q in self.queries:
            if q.query_id in self._by_id:
                raise DataError(self.name, f"query id {q.query_id!r} appears twice")
            self._by_id[q.query_id] = q

    def query(self, query_id: str) -> Query:
        try:
            return self._by_id[query_id]
        except KeyError:
            raise DataError(
                "query id",
                f"benchmark {self.name!r} has no query {query_id!r} (its ids look like "
                f"{self.queries[0].query_id!r}; see the queries file)",
            ) from None

    def select(
        self,
        ids: Sequence[str] | None = None,
        ids_file: Path | None = None,
        sample: int | None = None,
        seed: int = 0,
    ) -> list[Query]:
        """A slice of the queries: all, an id list, a file of ids, or a seeded stratified sample."""
        if ids_file is not None:
            ids = read_id_file(ids_file)
        if ids is not None:
            unknown = [i for i in ids if i not in self._by_id]
            if unknown:
                shown = ", ".join(unknown[:10]) + (" ..." if len(unknown) > 10 else "")
                raise DataError(
                    ids_file or "slice.ids",
                    f"{len(unknown)} query id(s) not in benchmark {self.name!r}: {shown}",
                )
            return [self._by_id[i] for i in dict.fromkeys(ids)]  # first occurrence wins
        if sample is not None:
            if sample > len(self.queries):
                raise DataError(
                    "slice.sample",
                    f"asks for {sample} queries but benchmark {self.name!r} has "
                    f"{len(self.queries)}; lower it, or drop slice.sample to run them all",
                )
            return stratified_sample(self.queries, sample, seed, self._stratum)
        return list(self.queries)

    def _stratum(self, q: Query) -> str:
        if q.stratum is not None:
            return q.stratum
        # Without a label, the size of the evidence set is the best proxy for difficulty.
        return f"evidence={min(len(self.evidence.get(q.query_id, {})), 10)}"


def read_id_file(path: Path) -> list[str]:
    """One query id per line (or comma-separated); blank lines and `#` comments ignored."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise DataError(path, f"cannot read id file: {e.strerror}") from e
    ids: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        ids.extend(part.strip() for part in line.split(",") if part.strip())
    if not ids:
        raise DataError(path, "id file holds no query ids")
    return ids


def stratified_sample(
    items: Sequence[Query], n: int, seed: int, stratum: Callable[[Query], str]
) -> list[Query]:
    """Proportional allocation (largest remainder) per stratum, seeded, in original order."""
    if n >= len(items):
        return list(items)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        groups[stratum(item)].append(i)
    keys = sorted(groups)
    quotas = {k: n * len(groups[k]) / len(items) for k in keys}
    alloc = {k: int(quotas[k]) for k in keys}
    leftover = n - sum(alloc.values())
    for k in sorted(keys, key=lambda k: (-(quotas[k] - alloc[k]), k))[:leftover]:
        alloc[k] += 1
    rng = random.Random(seed)
    chosen: list[int] = []
    for k in keys:
        chosen.extend(rng.sample(groups[k], alloc[k]))
    return [items[i] for i in sorted(chosen)]


def iter_nonempty(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) for each non-blank line."""
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line
