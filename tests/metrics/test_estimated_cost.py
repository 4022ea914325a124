"""Estimated spend (the prompts of calls cut at the budget or failed after sending) in prices,
the cost guard and the cost's wording."""

from __future__ import annotations

import pytest

from piserini_ray.metrics.cost import CostGuard, Price, cost_text
from piserini_ray.records import Usage

PRICE = Price(input=2.0, output=10.0, cache_read=0.2)  # USD per million tokens
REPORTED = Usage(input_tokens=10_000, cached_tokens=4_000, output_tokens=500)
CUT = Usage(input_tokens=3_000, estimated_input_tokens=3_000)


def test_estimated_tokens_are_priced_as_uncached_input() -> None:
    both = REPORTED + CUT
    assert both.input_tokens == 13_000 and both.estimated_input_tokens == 3_000
    assert PRICE.cost(both) == pytest.approx(PRICE.cost(REPORTED) + 3_000 * 2.0 / 1e6)
    assert PRICE.estimated_cost(both) == pytest.approx(0.006)
    assert PRICE.estimated_cost(REPORTED) == 0


def test_the_cost_guard_counts_estimated_spend_and_says_so() -> None:
    guard, unaware = CostGuard(cap=0.072, price=PRICE), CostGuard(cap=0.072, price=PRICE)
    for _ in range(3):
        guard.finished(REPORTED + CUT)
        unaware.finished(REPORTED)  # what the guard counted before: the cut calls cost 0
    assert guard.spent == pytest.approx(3 * PRICE.cost(REPORTED + CUT))
    assert guard.estimated == pytest.approx(3 * 0.006)
    assert unaware.may_start(in_flight=0)  # 4 x $0.0178 fits under $0.072 ...
    assert not guard.may_start(in_flight=0)  # ... but not with what the cut calls cost
    reason = guard.stop_reason() or ""
    assert "(of which $0.0180 estimated for calls cut at the budget or failed after sending)" in (
        reason
    )
    plain = CostGuard(cap=0.0001, price=PRICE)
    plain.finished(REPORTED)
    plain.may_start(in_flight=0)
    assert "estimated" not in (plain.stop_reason() or "")


def test_cost_text() -> None:
    assert cost_text(1.5, 0.0, 0) == "$1.5000"
    assert cost_text(None, None, 3) == "not priced"
    assert cost_text(12.3456, 0.5, 1, digits=2) == (
        "$12.35 (of which $0.50 estimated for 1 call cut at the budget or failed after sending)"
    )
    assert "for 4 calls cut" in cost_text(2.0, 0.25, 4)
