"""A bare node's first search: the index shipped through Ray (`engines/ray/shipping.py`) against the
node rebuilding it from the corpus.

    python bench/index_shipping.py                                   # the embedded sample
    python bench/corpus.py --docs 10000 --queries 200 --out bench/out/corpus10k
    python bench/index_shipping.py --config bench/out/corpus10k/config.yaml

Each case is an actor standing for the bare node, with its own empty PISERINI_RAY_HOME: "ship"
fetches the driver's index from the driver's node (`driver_services.py`; chunked, every file's
SHA-256 checked) and opens it; "rebuild" builds the index from the corpus and opens it (which a
real bare node could only do with the corpus copied to it first); "reuse" opens a copy shipped
before, re-checking every file. Each ends with one search. On one machine the bytes cross
Ray's object store but no network: a cluster adds its network's transfer time to "ship" (about
1 s a GB at 10 Gb/s).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import append_results, header

from piserini_ray.config import RetrievalConfig, load_config
from piserini_ray.data import load_benchmark
from piserini_ray.retrieval import ensure_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, help="default: the embedded sample")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from piserini_ray.engines.ray.ray_env import prepare_local_ray

    prepare_local_ray()
    import ray

    ray.init(address="local", num_cpus=2, object_store_memory=256 << 20, include_dashboard=False)
    from piserini_ray.engines.ray.driver_services import driver_services
    from piserini_ray.engines.ray.shipping import IndexSource, serve_index

    config = load_config(args.config)
    benchmark = load_benchmark(config.benchmark)
    index = ensure_index(benchmark.corpus, config.retrieval, print)
    source = serve_index(index)
    _services = driver_services(start=True)  # as the driver starts it
    query = benchmark.queries[0].query
    # The driver's folder is not on a bare node: the replica must ship or rebuild (on this one
    # machine it would see the folder, so the bare node is told it does not; the bytes still
    # come from the driver's folder, read on its node by `driver_services.py`).
    remote_source = source

    @ray.remote(num_cpus=1)
    class BareNode:
        def __init__(self, home: str) -> None:
            os.environ["PISERINI_RAY_HOME"] = home

        def first_search(
            self, how: str, src: IndexSource, retrieval: RetrievalConfig, bench: Any, text: str
        ) -> float:
            from piserini_ray.engines.ray import shipping
            from piserini_ray.engines.ray.shipping import local_index
            from piserini_ray.retrieval.backends import open_backend

            shipping._same_sizes = lambda folder, files: False  # a bare node: not its folder

            started = time.monotonic()
            if how == "rebuild":
                folder = ensure_index(
                    load_benchmark(bench).corpus,
                    retrieval.model_copy(
                        update={"index_root": Path(os.environ["PISERINI_RAY_HOME"])}
                    ),
                )
            else:
                folder = local_index(src, lambda _m: None)
            open_backend(folder, retrieval).search_docids(text)
            return time.monotonic() - started

    rows = []
    for repeat in range(args.repeats):
        for how in ("rebuild", "ship", "reuse"):
            with tempfile.TemporaryDirectory() as home:
                if how == "reuse":  # a copy shipped by an earlier run is there already
                    earlier = BareNode.remote(home)
                    ray.get(earlier.first_search.remote("ship", remote_source, config.retrieval,
                                                        config.benchmark, query))  # fmt: skip
                    ray.kill(earlier)
                node = BareNode.remote(home)  # a new process: the JVM boots in every case
                seconds = ray.get(
                    node.first_search.remote(
                        how, remote_source, config.retrieval, config.benchmark, query
                    )
                )
                ray.kill(node)
            rows.append((repeat, how, seconds))
            print(f"repeat {repeat}: {how} {seconds:.2f} s", file=sys.stderr)
    best = {how: min(s for _, h, s in rows if h == how) for how in ("rebuild", "ship", "reuse")}
    lines = header(
        "A bare node's first search: shipped index vs rebuilt",
        f"Corpus {benchmark.corpus.name}: {len(benchmark.corpus.files)} file(s), index "
        f"{source.files.bytes / 2**20:.1f} MiB in {len(source.files.files)} files; best of "
        f"{args.repeats}.",
    )
    lines += ["| case | seconds to the first search |", "|---|---|"]
    lines += [f"| {how} | {best[how]:.2f} |" for how in ("rebuild", "ship", "reuse")]
    lines += ["", f"Shipping is {best['rebuild'] / best['ship']:.1f}x faster than rebuilding."]
    append_results(lines)


if __name__ == "__main__":
    main()
