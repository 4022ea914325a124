"""The BM25 grid on Ray: dedicated searcher replicas, each evaluating many (k1, b) cells by
re-setting BM25 (no index is rebuilt); finished cells are written as they arrive and skipped on
a rerun."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray

from piserini_ray.analysis.bm25_grid import CellResult, GridStore, evaluate_cell
from piserini_ray.config import RunConfig
from piserini_ray.data import load_benchmark
from piserini_ray.engines.ray.readiness import actors_that_fit, check_feasible, wait_until_up
from piserini_ray.retrieval import BM25Searcher, ensure_index, open_searcher


@ray.remote
class TuningWorker:
    def __init__(self, config: RunConfig) -> None:
        self._jvm = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jvm")
        self.config = config
        self.benchmark = load_benchmark(config.benchmark)
        self.queries = self.benchmark.select(**config.slice.model_dump())
        self.searcher: BM25Searcher = self._jvm.submit(
            lambda: open_searcher(
                ensure_index(self.benchmark.corpus, config.retrieval), config.retrieval
            )
        ).result()

    def ready(self) -> int:
        return self.searcher.num_docs

    def evaluate(self, k1: float, b: float) -> CellResult:
        return self._jvm.submit(
            evaluate_cell,
            self.searcher,
            self.queries,
            self.benchmark,
            k1,
            b,
            self.config.retrieval.depth,
        ).result()


def tune_on_ray(
    config: RunConfig,
    k1s: list[float],
    bs: list[float],
    out: Path,
    replicas: int,
    log: Callable[[str], None],
) -> tuple[list[CellResult], float]:
    """Every cell of k1s x bs (computed or found in `out`); returns them and the wall seconds."""
    store = GridStore(out, log)
    done = store.done()
    todo = deque((k1, b) for k1 in k1s for b in bs if (k1, b) not in done)
    log(
        f"BM25 grid: {len(k1s) * len(bs)} cells, {len(done)} done before, {len(todo)} to run "
        f"on {replicas} replica(s)"
    )
    started = time.monotonic()
    if todo:
        retrieval = config.retrieval.with_resolved_index_root()
        ensure_index(load_benchmark(config.benchmark).corpus, retrieval, log)
        config = config.model_copy(update={"retrieval": retrieval})
        cpus = config.runtime.cpus_per_replica
        fix = "lower runtime.cpus_per_replica"
        check_feasible({"CPU": cpus}, "grid workers", fix, log)
        replicas = actors_that_fit(replicas, {"CPU": cpus}, "grid workers", log)
        workers = [
            TuningWorker.options(  # type: ignore[attr-defined]  # Ray types the class as is
                num_cpus=cpus
            ).remote(config)
            for _ in range(replicas)
        ]
        try:
            wait_until_up([w.ready.remote() for w in workers], "grid workers", log)
            in_flight: dict[Any, Any] = {}
            idle = list(workers)
            while todo or in_flight:
                while todo and idle:
                    worker = idle.pop()
                    k1, b = todo.popleft()
                    in_flight[worker.evaluate.remote(k1, b)] = worker
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                idle.append(in_flight.pop(ready[0]))
                cell = ray.get(ready[0])
                store.add(cell)
                done[(cell.k1, cell.b)] = cell
        finally:
            for worker in workers:
                ray.kill(worker)
    wall = time.monotonic() - started
    wanted = {(k1, b) for k1 in k1s for b in bs}
    return [c for key, c in done.items() if key in wanted], wall
