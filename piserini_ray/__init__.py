"""piserini_ray: distributed batch evaluation of agentic search over Lucene BM25."""

__version__ = "0.1.0"
