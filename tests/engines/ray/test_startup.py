"""A run starts only what it needs (issue 32), on a local Ray of this module's own (one node):
one light actor on the driver's node for the limiters, the index and the endpoints, from which a
replica that lacks the index fetches it, waiting on futures (no `ray.get`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from helpers import fresh_python
from ray.exceptions import RayTaskError
from test_shipping import FILES, _index

from piserini_ray.engines.ray.driver_services import driver_services
from piserini_ray.engines.ray.shipping import _fetch, serve_index, verified

pytestmark = pytest.mark.usefixtures("module_ray")


def _named() -> set[str]:
    return {a["name"] if isinstance(a, dict) else a for a in ray.util.list_named_actors()}


def test_a_replica_lacking_the_index_fetches_it_from_the_drivers_node_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISERINI_RAY_HOME", str(tmp_path / "home"))
    folder = _index(tmp_path / "idx-abc")
    source = serve_index(folder)
    assert source.node == ray.get_runtime_context().get_node_id()
    services = driver_services(start=True)  # as the driver starts it, with the replicas
    assert source.server in _named()

    logged: list[str] = []
    target = tmp_path / "shipped" / source.files.name
    target.parent.mkdir()
    _fetch(source, source.files, target, logged.append)  # as a replica lacking it
    assert f"shipped from node {ray.util.get_node_ip_address()}" in logged[-1]
    assert {p.name: p.read_bytes() for p in target.iterdir()} == FILES
    assert verified(target, source.files) == []
    # Only an index folder's own files: the folder comes with each call.
    (tmp_path / "secret.txt").write_text("not for the cluster")
    with pytest.raises(RayTaskError, match="not an index folder"):
        ray.get(services.chunk.remote(str(tmp_path), "secret.txt", 0, 10))
    with pytest.raises(RayTaskError, match="not a file of the index"):
        ray.get(services.chunk.remote(str(folder), "../secret.txt", 0, 10))


def test_a_fetch_keeps_its_bytes_in_flight_bounded_and_asks_small_files_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are asked for while their bytes in flight stay within `IN_FLIGHT_BYTES`: files
    split over several chunks come back whole, and small files go out together rather than
    one bounded batch of round trips after another."""
    from piserini_ray.engines.ray import shipping

    monkeypatch.setenv("PISERINI_RAY_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(shipping, "CHUNK_BYTES", 1000)  # _0.cfs: 6 chunks, segments_1: 1
    monkeypatch.setattr(shipping, "IN_FLIGHT_BYTES", 2500)
    source = serve_index(_index(tmp_path / "idx-bounded"))
    services = driver_services(start=True)
    asked: list[int] = []  # bytes in flight each time a chunk is asked for
    outstanding = [0]

    class Counting:  # the actor's handle, counting what is asked and not yet written
        def __init__(self) -> None:
            self.chunk, self.where = self, services.where

        def remote(self, folder: str, relative: str, offset: int, size: int) -> object:
            outstanding[0] += size
            asked.append(outstanding[0])
            return services.chunk.remote(folder, relative, offset, size)

    written = shipping.write_chunk

    def write(folder: Path, piece: tuple[str, int, int], data: bytes) -> None:
        outstanding[0] -= piece[2]
        written(folder, piece, data)

    monkeypatch.setattr(shipping.ray, "get_actor", lambda name: Counting())
    monkeypatch.setattr(shipping, "write_chunk", write)
    target = tmp_path / "shipped" / source.files.name
    target.parent.mkdir()
    _fetch(source, source.files, target, lambda line: None)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == FILES
    # _0.cfs two chunks at a time (a third would pass 2500), then both small files at once.
    assert [p.path for p in source.files.files] == ["_0.cfs", "index.json", "segments_1"]
    assert asked == [1000, 2000, 2000, 2000, 2000, 2000, 2011, 2311]


def test_a_hosted_model_is_checked_once_per_node_however_many_replicas_and_runs(
    sample_index: Path, index_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one model (other budgets) share two replicas on this one node: one check."""
    from piserini_ray.config import load_config
    from piserini_ray.offline import OfflineConfig, OfflineProvider
    from piserini_ray.pipeline import run_on_ray

    monkeypatch.setenv("PISERINI_STARTUP_KEY", "sk-startup-test")
    served = OfflineConfig(model_aliases={"gpt-5.4-mini": "offline/heuristic"})
    with OfflineProvider(served) as provider:
        configs = [
            load_config(
                None,
                {
                    "retrieval.index_root": str(index_root),
                    "slice.sample": 2,
                    "runtime.replicas": 2,
                    "agent.budget_seconds": budget,
                    "model": {
                        "name": "gpt-5.4-mini",
                        "litellm_model": "openai/gpt-5.4-mini",
                        "api_base": provider.base_url,
                        "api_key_env": "PISERINI_STARTUP_KEY",
                    },
                },
            )
            for budget in (300.0, 301.0)
        ]
        logged: list[str] = []
        runs = [(config, tmp_path / f"run-{i}") for i, config in enumerate(configs)]
        summaries = run_on_ray(runs, logged.append)
    assert [s.statuses for s in summaries] == [{"completed": 2}] * 2
    assert "2 searcher replica(s) ready on 1 node(s)" in "\n".join(logged)
    node_checks = [m for m in logged if m.startswith("checked gpt-5.4-mini from node")]
    assert len(node_checks) == 1, logged
    # and not once more from the driver: the replicas' check is the one that counts
    assert not [m for m in logged if m.startswith("checked gpt-5.4-mini:")], logged


def test_the_reports_modules_load_beside_the_queries_and_a_failed_import_waits_for_its_use() -> (
    None
):
    # In a fresh interpreter (this one has the reports loaded): the driver's thread that
    # loads what comes after the last query, while the queries run.
    script = (
        "import sys\n"
        "from piserini_ray.engines.ray.scheduler import AFTER_THE_QUERIES, _load_meanwhile\n"
        "assert 'piserini_ray.reports.html' not in sys.modules\n"
        "_load_meanwhile((*AFTER_THE_QUERIES, 'piserini_ray.no_such_module')).join()\n"
        "import piserini_ray\n"
        "print('piserini_ray.reports.html' in sys.modules, callable(piserini_ray.report))\n"
    )
    assert fresh_python(script).split() == ["True", "True"]
