"""Parsing the agent's final answer (docs/spec.md §4: Explanation / Exact Answer / Confidence)."""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import BaseModel

_FIELD = r"^[ \t>*_#-]*\**\s*{name}\s*\**\s*[:：]\s*\**\s*(?P<value>.*?)\s*\**\s*$"
_EXPLANATION = re.compile(_FIELD.format(name="explanation"), re.I | re.M)
_EXACT = re.compile(_FIELD.format(name="exact[ _]answer"), re.I | re.M)
_CONFIDENCE = re.compile(_FIELD.format(name="confidence"), re.I | re.M)
_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)")
_CITATION = re.compile(r"\[([^\[\]\n]{1,200})\]")


class ParsedAnswer(BaseModel):
    explanation: str | None = None
    exact_answer: str | None = None
    #: 0-100; 100 when the answer gives none (and `confidence_missing` says so).
    confidence: float = 100.0
    confidence_missing: bool = True
    cited: list[str] = []


def parse_final_answer(
    text: str | None, docid_exists: Callable[[str], bool] = lambda _d: True
) -> ParsedAnswer:
    """Tolerant of markdown bold, case and a missing percent sign; cited docids are kept only
    if they exist. A reply without an `Exact Answer` line parses to `exact_answer=None`."""
    if not text:
        return ParsedAnswer()
    exact = _EXACT.search(text)
    explanation = _EXPLANATION.search(text)
    # docs/spec.md §7: the *last* confidence line counts (an answer may restate it), its sign kept
    # before the clamp (`-5%` is 0, not 5).
    confidence = None
    lines = _CONFIDENCE.findall(text)
    if lines and (number := _NUMBER.search(lines[-1])):
        confidence = min(100.0, max(0.0, float(number[1])))
    cited: dict[str, None] = {}
    for group in _CITATION.findall(text):
        for docid in re.split(r"[,;]\s*|\s+", group.strip()):
            docid = docid.strip().strip("`'\"")
            if docid and docid_exists(docid):
                cited.setdefault(docid)
    return ParsedAnswer(
        explanation=explanation["value"] if explanation else None,
        exact_answer=(exact["value"] or None) if exact else None,
        confidence=100.0 if confidence is None else confidence,
        confidence_missing=confidence is None,
        cited=list(cited),
    )
