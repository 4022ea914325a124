"""The shipped Grafana dashboard (`configs/grafana/piserini-ray.json`) charts the metrics the
driver exports (`engines/ray/metrics.py`), every one of them, and no name it does not export."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[3]
#: Prometheus's names of a Ray metric: `ray_` before it; `_total` after a counter, `_bucket`,
#: `_count` and `_sum` after a histogram.
SUFFIXES = re.compile(r"_(total|bucket|count|sum)$")


def _exported() -> dict[str, str]:
    source = (ROOT / "piserini_ray/engines/ray/metrics.py").read_text()
    return dict(
        (name, kind)
        for kind, name in re.findall(r"(Counter|Gauge|Histogram)\(\s*\"(piserini_\w+)\"", source)
    )


def test_the_dashboard_charts_every_exported_metric_and_nothing_else() -> None:
    dashboard = json.loads((ROOT / "configs/grafana/piserini-ray.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    charted = {
        SUFFIXES.sub("", n).removeprefix("ray_")
        for e in exprs
        for n in re.findall(r"ray_piserini_\w+", e)
    }
    exported = _exported()
    assert len(exported) == 11
    assert charted == set(exported)
    for expr in exprs:
        for name in re.findall(r"ray_piserini_\w+", expr):
            base = SUFFIXES.sub("", name).removeprefix("ray_")
            kind = exported[base]
            if kind == "Counter":
                assert name.endswith("_total"), name
            elif kind == "Histogram":
                assert name.endswith("_bucket"), name
            else:
                assert not SUFFIXES.search(name), name
    run_variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "run")
    assert "ray_piserini_queries_total" in run_variable["query"]
