"""Excerpts of a document around the first query token (docs/spec.md §3, "Hit layout")."""

from __future__ import annotations

import re

#: Lucene's English stop words, the set Anserini's default analyzer removes.
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._-]*")
_SPACE = re.compile(r"\s+")


def query_tokens(query: str) -> list[str]:
    """Lower-cased tokens of a query, stop words and one-character tokens removed, deduplicated."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall(query.lower()):
        if len(token) >= 2 and token not in STOP_WORDS:
            seen.setdefault(token)
    return list(seen)


def token_pattern(tokens: list[str]) -> re.Pattern[str] | None:
    """One regex finding any of the tokens as a whole token (not inside a longer word)."""
    if not tokens:
        return None
    alternation = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z0-9])(?:{alternation})(?![A-Za-z0-9])", re.IGNORECASE)


def excerpt(text: str, pattern: re.Pattern[str] | None, width: int = 220, lead: int = 55) -> str:
    """About `width` characters starting about `lead` characters before the first match."""
    match = pattern.search(text) if pattern is not None else None
    start = max(0, match.start() - lead) if match else 0
    piece = _SPACE.sub(" ", text[start : start + width]).strip()
    prefix = "…" if start > 0 else ""
    suffix = "…" if start + width < len(text) else ""
    return f"{prefix}{piece}{suffix}"
