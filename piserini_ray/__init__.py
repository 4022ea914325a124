"""piserini_ray: distributed batch evaluation of agentic search over Lucene BM25."""

import os as _os

# litellm fetches its price map from the internet at import unless told otherwise; these
# machines (and many clusters) have no route out, and a run must not depend on one.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
