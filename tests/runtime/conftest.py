"""The local Ray that a test module of the runtime shares (2 CPUs, a small object store, no
dashboard): `pytestmark = pytest.mark.usefixtures("module_ray")`. Modules that need Ray
instances of their own (several nodes, processes killed) start them themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray


@pytest.fixture(scope="module")
def module_ray() -> Iterator[None]:
    ray.init(
        num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False
    )
    yield
    ray.shutdown()
