"""Ray job entry point: run a sweep (all its runs at once) on the cluster this job runs in.

ray job submit --working-dir . -- python jobs/sweep.py configs/sweep_models_timeouts.yaml
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from piserini_ray.cli import entry

if __name__ == "__main__":
    entry(["sweep", *sys.argv[1:]])
