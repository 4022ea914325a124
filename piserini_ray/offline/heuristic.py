"""The `offline/heuristic` model: a deterministic agent that plays the tool protocol.

It reads the conversation it is sent and decides from it alone (no hidden state, so a resumed or
repeated conversation gets the same reply):

1. search the question's distinctive words;
2. browse the next page of that ranking;
3. open the two most promising documents shown so far (two tool calls in one turn);
4. if the question has more hops, search again with a new clue: the most salient name in the
   opened documents that the question does not mention, plus the question's words;
5. open the best new document;
6. answer: the candidate (a name, number or date, by the question's wording) that occurs most
   often near the question's words in the opened documents, citing where it was found.

After the submit-now steer, or when a tool says it is blocked, it answers at once. Its accuracy
is whatever this lexical heuristic achieves; it exists to exercise every tool, the steer and the
answer format at zero cost, not to be clever.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import orjson

from piserini_ray.offline.policy import PolicyReply, PolicyToolCall
from piserini_ray.tools.excerpt import STOP_WORDS, query_tokens

_QUESTION_WORDS = frozenset(
    "who whom whose what which when where why how many much does did do was were is are the "
    "name named called one person also".split()
)
_HIT = re.compile(
    r"^\[(\d+)\] docid: (\S+) \| score: \S+\n(?:    title: (.*)\n)?(?:    excerpt: (.*))?", re.M
)
_DOC_HEADER = re.compile(r"^Document (\S+)(?: \((.*)\))?: lines \d+-\d+ of \d+\.", re.M)
_SEARCH_ID = re.compile(r"^Search (s\d+) for ", re.M)
_NAME = re.compile(
    r"\b(?:[A-Z][\w'’.-]*(?:\s+(?:of|the|de|von|van|and|du|la|le|for)?\s*[A-Z][\w'’.-]*)*)"
)
_NUMBER = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")


def heuristic_policy(request: dict[str, Any]) -> PolicyReply:
    messages: list[dict[str, Any]] = request.get("messages") or []
    question = _question(messages)
    keywords = [t for t in query_tokens(question) if t not in _QUESTION_WORDS][:10]
    observations = _observations(messages)
    if _must_answer(messages):
        return _answer(question, keywords, observations)
    calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    searches = [c for c in calls if _name(c) == "search"]
    opened = {_arg(c, "docid") for c in calls if _name(c) == "read_document"}
    shown = observations["hits"]

    if not searches:
        return _call("search", "Start with the question's most distinctive words.",
                     query=" ".join(keywords) or question)  # fmt: skip
    if not any(_name(c) == "read_search_results" for c in calls) and observations["search_ids"]:
        return _call("read_search_results", "Browse below the first page before rewriting.",
                     search_id=observations["search_ids"][0], offset=6, limit=10)  # fmt: skip
    candidates = [h for h in _rank_hits(shown, keywords) if h["docid"] not in opened]
    if len(opened) < 2 and candidates:
        return PolicyReply(
            tool_calls=[
                _tool_call(
                    "read_document",
                    f"Open a promising hit ({h['docid']}).",
                    docid=h["docid"],
                    offset=1,
                    limit=50,
                )  # fmt: skip
                for h in candidates[: 2 - len(opened)]
            ]
        )
    hops = _hops(question)
    if len(searches) < hops:
        clue = _new_clue(observations["documents"], question)
        if clue:
            query = " ".join([clue, *keywords[:4]])
            return _call("search", f"Search again with a new clue: {clue}.", query=query)
    latest = observations["latest_hits"]
    fresh = [h for h in _rank_hits(latest, keywords) if h["docid"] not in opened]
    if fresh and len(opened) < 2 + (hops - 1):
        h = fresh[0]
        return _call("read_document", f"Open the best hit of the new search ({h['docid']}).",
                     docid=h["docid"], offset=1, limit=50)  # fmt: skip
    return _answer(question, keywords, observations)


# ---------------------------------------------------------------------- reading the conversation


def _question(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user":
            text = _text(message)
            return text.split(":", 1)[1].strip() if text.startswith("Question:") else text
    return ""


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _must_answer(messages: list[dict[str, Any]]) -> bool:
    last = messages[-1] if messages else {}
    if last.get("role") == "user" and len([m for m in messages if m.get("role") == "user"]) > 1:
        return True  # a user message after the question is the submit-now steer
    return last.get("role") == "tool" and "Tools are blocked" in _text(last)


def _name(call: dict[str, Any]) -> str:
    return str(call.get("function", {}).get("name", ""))


def _arg(call: dict[str, Any], key: str) -> Any:
    try:
        return orjson.loads(call.get("function", {}).get("arguments") or "{}").get(key)
    except (orjson.JSONDecodeError, AttributeError):
        return None


def _observations(messages: list[dict[str, Any]]) -> dict[str, Any]:
    hits: dict[str, dict[str, str]] = {}
    latest: dict[str, dict[str, str]] = {}
    documents: dict[str, str] = {}
    search_ids: list[str] = []
    for message in messages:
        if message.get("role") != "tool":
            continue
        text = _text(message)
        if match := _SEARCH_ID.match(text):
            search_ids.append(match[1])
            if text.startswith(f"Search {match[1]} for ") and "Showing ranks 1-" in text:
                latest = {}
        for rank, docid, title, excerpt in _HIT.findall(text):
            hit = {"docid": docid, "rank": rank, "title": title, "excerpt": excerpt}
            hits.setdefault(docid, hit)
            latest.setdefault(docid, hit)
        if match := _DOC_HEADER.match(text):
            documents[match[1]] = text
    return {"hits": list(hits.values()), "latest_hits": list(latest.values()),
            "documents": documents, "search_ids": search_ids}  # fmt: skip


def _rank_hits(hits: list[dict[str, str]], keywords: list[str]) -> list[dict[str, str]]:
    def overlap(hit: dict[str, str]) -> tuple[int, int]:
        words = set(query_tokens(f"{hit['title']} {hit['excerpt']}"))
        return (-len(words & set(keywords)), int(hit["rank"]))

    return sorted(hits, key=overlap)


def _hops(question: str) -> int:
    """More clauses, more hops: a rough count of the question's linked parts (1 to 3)."""
    links = len(re.findall(r"\b(?:of|which|that|whose|who|where|by|in)\b", question.lower()))
    return 1 + min(2, links // 2)


def _new_clue(documents: dict[str, str], question: str) -> str | None:
    asked = set(query_tokens(question))
    counts: Counter[str] = Counter()
    for text in documents.values():
        for name in _NAME.findall(text):
            tokens = query_tokens(name)
            if tokens and not set(tokens) <= asked and name.lower() not in STOP_WORDS:
                counts[name.strip()] += 1
    for name, _ in counts.most_common():
        if len(name) > 2 and not name.startswith(("Document", "Search", "More")):
            return name
    return None


# ---------------------------------------------------------------------- answering


def _answer(question: str, keywords: list[str], observations: dict[str, Any]) -> PolicyReply:
    asked = set(query_tokens(question))
    lower = question.lower()
    wants_number = "how many" in lower or "how much" in lower or "number" in lower
    wants_year = "what year" in lower or lower.startswith("when") or "which year" in lower
    scores: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    sources = dict(observations["documents"])
    for hit in observations["hits"]:
        sources.setdefault(hit["docid"], f"{hit['title']}\n{hit['excerpt']}")
    for docid, text in sources.items():
        for sentence in re.split(r"(?<=[.!?])\s+|\n", text):
            near = len(set(query_tokens(sentence)) & set(keywords))
            if near == 0:
                continue
            pattern = _YEAR if wants_year else _NUMBER if wants_number else _NAME
            for candidate in pattern.findall(sentence):
                candidate = candidate.strip(" ,.")
                tokens = query_tokens(candidate)
                if not tokens or set(tokens) <= asked or candidate.startswith("Document"):
                    continue
                scores[candidate] += near * (2 if docid in observations["documents"] else 1)
                where.setdefault(candidate, [])
                if docid not in where[candidate]:
                    where[candidate].append(docid)
    if not scores:
        return PolicyReply(
            content="Explanation: The documents I read did not name an answer.\n"
            "Exact Answer: unknown\nConfidence: 5%"
        )
    ranked = scores.most_common(2)
    best, top = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    confidence = max(10, min(90, int(100 * top / (top + runner_up + 1))))
    cites = " ".join(f"[{d}]" for d in where[best][:3])
    return PolicyReply(
        content=f"Explanation: {best} appears most often next to the question's words {cites}.\n"
        f"Exact Answer: {best}\nConfidence: {confidence}%"
    )


def _call(name: str, reason: str, **arguments: Any) -> PolicyReply:
    return PolicyReply(tool_calls=[_tool_call(name, reason, **arguments)])


def _tool_call(name: str, reason: str, **arguments: Any) -> PolicyToolCall:
    return PolicyToolCall(
        name=name, arguments=orjson.dumps({"reason": reason, **arguments}).decode()
    )
