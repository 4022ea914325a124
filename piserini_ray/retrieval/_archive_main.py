"""`python -m piserini_ray.retrieval._archive_main`: make this machine's JVM class archive for
the searchers if it is missing (`class_archive.py`); `--record INDEX` writes the class list
anew from a searcher's work on INDEX (after a pyserini / Anserini upgrade)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from piserini_ray.retrieval.class_archive import CLASS_LIST, record
from piserini_ray.retrieval.jvm import ensure_class_archive

#: What `--record` has a searcher do: the searches a query's tools make (its documents come
#: from the docstore, not the JVM).
WORKLOAD = (
    "who founded the city where the river meets the sea",
    "film director born in 1950",
    "album released by the band",
)


def workload(index: Path) -> None:
    from piserini_ray.config import RetrievalConfig
    from piserini_ray.retrieval.searcher import open_searcher

    searcher = open_searcher(index, RetrievalConfig())
    for text in WORKLOAD:
        searcher.search(text, 1000)
    searcher.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m piserini_ray.retrieval._archive_main",
        description="Make this machine's JVM class archive for the searchers, if missing.",
    )
    parser.add_argument("--record", type=Path, metavar="INDEX", help="record the class list")
    parser.add_argument("--workload", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload:
        workload(args.workload)
        return 0
    if args.record:
        print(f"{record(args.record)} classes -> {CLASS_LIST}")
        return 0
    made = ensure_class_archive()
    if made is not None:
        print(f"JVM class archive: {made}")
    return 0 if made is not None else 1


if __name__ == "__main__":
    sys.exit(main())
