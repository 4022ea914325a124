"""Child-process entry points that need a JVM: index a collection, and map Lucene ids to ordinals.

Run by `piserini_ray.retrieval.index` as `python -m piserini_ray.retrieval._indexer_main ...`
so that the indexer's JVM (and any crash in it) stays out of the caller's process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from piserini_ray.retrieval.jvm import autoclass, boot_jvm


def index_collection(args: list[str]) -> None:
    autoclass("io.anserini.index.IndexCollection").main(args)


def write_ordinal_table(lucene_dir: Path, docs_jsonl: Path, out: Path) -> None:
    """`out[i]` = ordinal of the document Lucene numbers `i` (Lucene's order is not ours)."""
    import orjson

    with open(docs_jsonl, "rb") as f:
        ordinal = {orjson.loads(line)["docid"]: i for i, line in enumerate(f)}
    paths = autoclass("java.nio.file.Paths")
    reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
        autoclass("org.apache.lucene.store.FSDirectory").open(paths.get(str(lucene_dir)))
    )
    fields = autoclass("java.util.Collections").singleton("id")
    stored = reader.storedFields()
    table = np.empty(reader.maxDoc(), dtype=np.int32)
    for i in range(reader.maxDoc()):
        table[i] = ordinal[stored.document(i, fields).get("id")]
    reader.close()
    if len(set(table.tolist())) != len(ordinal):
        raise SystemExit(f"index holds {len(table)} documents, docstore {len(ordinal)}")
    np.save(out, table)


if __name__ == "__main__":
    boot_jvm(os.environ.get("PISERINI_RAY_JVM_HEAP", "1g"))
    command, *rest = sys.argv[1:]
    if command == "index":
        index_collection(rest)
    elif command == "ordinals":
        write_ordinal_table(Path(rest[0]), Path(rest[1]), Path(rest[2]))
    else:
        raise SystemExit(f"unknown command {command!r}")
