"""Ray job entry point: run (or resume) one benchmark run on the cluster this job runs in.

    ray job submit --working-dir . -- python jobs/run_benchmark.py --config configs/X.yaml

Inside a Ray job `RAY_ADDRESS` is set, so the run joins that cluster instead of starting one.
Every option of `piserini-ray run` applies.
"""

import sys
from pathlib import Path

# The job's working directory holds this checkout; prefer its code over an installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from piserini_ray.cli import entry

if __name__ == "__main__":
    entry(["run", *sys.argv[1:]])
