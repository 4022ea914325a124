"""Document text served to the tools, memory-mapped so replicas on a node share page cache.

Layout of a docstore folder: `docstore.bin` (every document's contents, UTF-8, concatenated),
`docstore.offsets.npy` (int64 byte offsets, n + 1 of them) and `docs.jsonl` (docid, title, url
per document, in the same order). Position in that order is a document's *ordinal*.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson

from piserini_ray.data.benchmark import Document
from piserini_ray.errors import DataError


class DocstoreWriter:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._bin: BinaryIO = open(folder / "docstore.bin", "wb")  # noqa: SIM115 (closed in close)
        self._meta: BinaryIO = open(folder / "docs.jsonl", "wb")  # noqa: SIM115
        self._offsets: list[int] = [0]
        self._seen: set[str] = set()

    def add(self, doc: Document, contents: str) -> int:
        if doc.docid in self._seen:
            raise DataError("corpus", f"docid {doc.docid!r} appears twice")
        self._seen.add(doc.docid)
        data = contents.encode("utf-8")
        self._bin.write(data)
        self._offsets.append(self._offsets[-1] + len(data))
        meta = {"docid": doc.docid, "title": doc.title, "url": doc.url}
        self._meta.write(orjson.dumps(meta) + b"\n")
        return len(self._offsets) - 2

    def close(self) -> int:
        self._bin.close()
        self._meta.close()
        np.save(self.folder / "docstore.offsets.npy", np.asarray(self._offsets, dtype=np.int64))
        return len(self._offsets) - 1


def read_docids(folder: Path) -> list[str]:
    """The docids of a docstore (an index folder), in ordinal order, without mapping the text."""
    with open(folder / "docs.jsonl", "rb") as f:
        return [orjson.loads(line)["docid"] for line in f]


class Docstore:
    """Read side: contents by ordinal, ordinal by docid."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets = np.load(folder / "docstore.offsets.npy")
        self.docids: list[str] = []
        self.titles: list[str | None] = []
        self.urls: list[str | None] = []
        with open(folder / "docs.jsonl", "rb") as f:
            for line in f:
                meta = orjson.loads(line)
                self.docids.append(meta["docid"])
                self.titles.append(meta["title"])
                self.urls.append(meta["url"])
        self.ordinal = {docid: i for i, docid in enumerate(self.docids)}
        with open(folder / "docstore.bin", "rb") as f:
            size = self.offsets[-1]
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.docids)

    def contents(self, ordinal: int) -> str:
        start, end = int(self.offsets[ordinal]), int(self.offsets[ordinal + 1])
        return self._map[start:end].decode("utf-8")
