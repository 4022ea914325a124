"""The test kit: what only the tests need of a provider, kept out of the product.

`EmulatedProvider` is the product's offline provider (`piserini_ray.offline`) with seeded fault
rates (`FaultRates`), scripted one-shot behaviours (`Scripted`), a gate that holds requests
(`hold`, `release`, `wait_held`), batch fates (`BatchFates`) and `reset`. A test starts one and
points a run's `model.api_base` at its `base_url`. The package is not part of the product's
wheel (pyproject's `[tool.setuptools.packages.find]`); the tests import it from the repository
(pytest's `pythonpath`).
"""

from piserini_ray_testkit.provider import EmulatedProvider, Emulation
from piserini_ray_testkit.settings import REPLY_FAULTS, BatchFates, FaultRates, Scripted

__all__ = ["REPLY_FAULTS", "BatchFates", "EmulatedProvider", "Emulation", "FaultRates", "Scripted"]
