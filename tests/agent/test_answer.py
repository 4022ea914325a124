import pytest

from piserini_ray.agent.answer import parse_final_answer


@pytest.mark.parametrize(
    ("text", "exact", "confidence", "missing"),
    [
        ("Explanation: x [d1]\nExact Answer: Paris\nConfidence: 85%", "Paris", 85, False),
        ("**Explanation:** x\n**Exact Answer:** Paris\n**Confidence:** 85%", "Paris", 85, False),
        ("explanation: x\nexact answer: Paris\nconfidence: 85", "Paris", 85, False),
        ("Exact Answer: **Paris**\nConfidence: 62.5 %", "Paris", 62.5, False),
        ("- Exact_Answer: 1,000\n- Confidence: 150%", "1,000", 100, False),
        # docs/spec.md §7: the last confidence line counts, its sign kept before the clamp.
        ("Confidence: 90%\nExact Answer: Paris\nConfidence: 40%", "Paris", 40, False),
        ("Exact Answer: Paris\nConfidence: -5%", "Paris", 0, False),
        ("Exact Answer: Paris\nConfidence: high\nConfidence: 70", "Paris", 70, False),
        ("Exact Answer: Paris", "Paris", 100, True),
        ("I think it is Paris.", None, 100, True),
        ("", None, 100, True),
        (None, None, 100, True),
    ],
)
def test_parse(text, exact, confidence, missing) -> None:
    parsed = parse_final_answer(text)
    assert parsed.exact_answer == exact
    assert parsed.confidence == confidence and parsed.confidence_missing is missing


def test_citations_kept_only_when_they_exist() -> None:
    text = "Explanation: see [d1], [d2, d3] and [nope] [d1]\nExact Answer: x\nConfidence: 5%"
    parsed = parse_final_answer(text, lambda d: d in {"d1", "d3"})
    assert parsed.cited == ["d1", "d3"]
    assert parsed.explanation == "see [d1], [d2, d3] and [nope] [d1]"
