"""Ray job entry point: the BM25 (k1, b) grid on the cluster this job runs in.

ray job submit --working-dir . -- python jobs/tune_bm25.py configs/X.yaml --k1 0.9,25 --b 0.4,1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from piserini_ray.cli import entry

if __name__ == "__main__":
    entry(["tune-bm25", *sys.argv[1:]])
