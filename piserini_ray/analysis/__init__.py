"""Analyses that plan or decide over runs, below the engines and the reports that use them:
`bm25_grid` (BM25 settings scored over a grid of k1 and b, per backend), `estimate` (a pilot's
projection of a slice's cost and makespan) and `stopping` (a sweep's sequential decisions: when
a run's comparison is decided).

The formulas they use are in `metrics` (paired tests, power, sequential bounds); what they write
is in `reports`."""
