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

With a `temperature` above 0 the answer is drawn from the five best candidates with weights
score^(1 / temperature), seeded by the request's `seed` (0 when none) and the question: the same
seed gives the same answer, another seed may not (what epochs, `run.epochs`, need to differ).

After the submit-now steer, or when a tool says it is blocked, it answers at once. Its accuracy
is whatever this lexical heuristic achieves; it exists to exercise every tool, the steer and the
answer format at zero cost, not to be clever.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from piserini_ray.offline.policy import PolicyReply, PolicyToolCall
from piserini_ray.tools.excerpt import query_tokens

QUESTION_WORDS = frozenset(
    [
        "who",
        "whom",
        "whose",
        "what",
        "which",
        "when",
        "where",
        "why",
        "how",
        "many",
        "much",
        "does",
        "did",
        "do",
        "was",
        "were",
        "is",
        "are",
        "the",
        "name",
        "named",
        "called",
        "one",
        "person",
        "also",
    ]
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
_DATE = re.compile(
    r"\b(?:(?:January|February|March|April|May|June|July|August|September|October|November|"
    r"December)\s+(?:\d{1,2},?\s+)?)?(?:1[0-9]{3}|20[0-9]{2})\b"
)
_BOILERPLATE = ("Document", "Search", "More", "Error", "Explanation")


def heuristic_policy(request: dict[str, Any]) -> PolicyReply:
    messages: list[dict[str, Any]] = request.get("messages") or []
    question = question_of(messages)
    keywords = [t for t in query_tokens(question) if t not in QUESTION_WORDS][:12]
    hops = hops_so_far(messages)
    sampling = _sampling(request)
    if must_answer(messages) or not keywords:
        return answer_from(question, keywords, hops, sampling)
    planned = _planned_hops(question)
    if not hops:
        return tool_reply(
            "search", "Start with the question's distinctive words.", query=" ".join(keywords)
        )
    hop = hops[-1]
    if not hop["browsed"] and hop["search_id"]:
        return tool_reply(
            "read_search_results",
            "Browse below the first page before rewriting.",
            search_id=hop["search_id"],
            offset=6,
            limit=10,
        )
    opened = {d for h in hops for d in h["opened"]}
    want = 2
    fresh = [h for h in rank_hits(hop["hits"], hop["keywords"]) if h["docid"] not in opened]
    if len(hop["opened"]) < want and fresh:
        return PolicyReply(
            tool_calls=[
                _tool_call(
                    "read_document",
                    f"Open a promising hit ({h['docid']}).",
                    docid=h["docid"],
                    offset=1,
                    limit=50,
                )
                for h in fresh[: want - len(hop["opened"])]
            ]
        )
    if len(hops) < planned:
        clue = _new_clue(hop, question, [h["clue"] for h in hops])
        if clue:
            seen = " ".join(hop["texts"].values()).lower()
            rest = [k for k in keywords if k not in seen] or keywords[:3]
            return tool_reply(
                "search",
                f"Search again with a new clue: {clue}.",
                query=" ".join([clue, *rest[:4]]),
            )
    return answer_from(question, keywords, hops, sampling)


@dataclass(frozen=True)
class Sampling:
    """How a sampled answer is drawn: weights score^(1 / temperature), from `rng`."""

    temperature: float
    rng: random.Random

    def pick(self, ranked: list[tuple[str, int]]) -> tuple[str, int]:
        weights = [score ** (1 / self.temperature) for _, score in ranked]
        return self.rng.choices(ranked, weights)[0]


def _sampling(request: dict[str, Any]) -> Sampling | None:
    """The draw of a sampled answer (a temperature above 0), seeded by the request's seed."""
    temperature = request.get("temperature")
    if not isinstance(temperature, int | float) or temperature <= 0:
        return None
    seed = request.get("seed")
    question = question_of(request.get("messages") or [])
    rng = random.Random(f"{seed if isinstance(seed, int) else 0}:{question}")
    return Sampling(float(temperature), rng)


# ---------------------------------------------------------------------- reading the conversation


def question_of(messages: list[dict[str, Any]]) -> str:
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


def must_answer(messages: list[dict[str, Any]]) -> bool:
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


def hops_so_far(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as hops: each search with the hits it showed and documents opened."""
    results = {m.get("tool_call_id"): _text(m) for m in messages if m.get("role") == "tool"}
    hops: list[dict[str, Any]] = []
    for message in messages:
        for call in message.get("tool_calls") or [] if message.get("role") == "assistant" else []:
            name, text = _name(call), results.get(call.get("id"), "")
            if name == "search":
                query = str(_arg(call, "query") or "")
                match = _SEARCH_ID.match(text)
                clue = str(_arg(call, "reason") or "").removeprefix(
                    "Search again with a new clue: "
                )
                hops.append(
                    {
                        "query": query,
                        "keywords": query_tokens(query),
                        "search_id": match[1] if match else None,
                        "browsed": False,
                        "hits": [],
                        "opened": [],
                        "texts": {},
                        "clue": clue.rstrip(".") if hops else None,
                    }
                )
            if not hops:
                continue
            hop = hops[-1]
            if name == "read_search_results":
                hop["browsed"] = True
            for rank, docid, title, excerpt in _HIT.findall(text):
                hop["hits"].append(
                    {"docid": docid, "rank": rank, "title": title, "excerpt": excerpt}
                )
            if name == "read_document" and (match := _DOC_HEADER.match(text)):
                hop["opened"].append(match[1])
                hop["texts"][match[1]] = text
    return hops


def rank_hits(hits: list[dict[str, str]], keywords: list[str]) -> list[dict[str, str]]:
    def overlap(hit: dict[str, str]) -> tuple[int, int]:
        words = set(query_tokens(f"{hit['title']} {hit['excerpt']}"))
        return (-len(words & set(keywords)), int(hit["rank"]))

    return sorted(hits, key=overlap)


def _planned_hops(question: str) -> int:
    """More linked clauses, more hops: a rough count (1 to 3)."""
    links = len(re.findall(r"\b(?:of|which|that|whose|who|where|by|in)\b", question.lower()))
    return 1 + min(2, links // 2)


def _new_clue(hop: dict[str, Any], question: str, used: list[str | None]) -> str | None:
    """The most salient name in this hop's documents that the question does not mention:
    names in the sentences sharing most words with the question come first."""
    asked = set(query_tokens(question))
    scores: Counter[str] = Counter()
    titles = {t.lower() for h in hop["hits"] for t in [h["title"]] if t}
    for text in hop["texts"].values():
        for sentence in _sentences(text):
            near = len(set(query_tokens(sentence)) & asked)
            for name in _NAME.findall(sentence):
                name = name.strip(" .,")
                tokens = query_tokens(name)
                if (
                    not tokens
                    or set(tokens) <= asked
                    or name in used
                    or name.lower() in titles
                    or name.startswith(_BOILERPLATE)
                ):
                    continue
                scores[name] += 1 + near
    return scores.most_common(1)[0][0] if scores else None


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip()]


# ---------------------------------------------------------------------- answering


def answer_from(
    question: str,
    keywords: list[str],
    hops: list[dict[str, Any]],
    sampling: Sampling | None = None,
) -> PolicyReply:
    """The best-typed candidate near the question's words, from the last hop's documents
    (earlier hops' documents and hit excerpts count less); with `sampling`, one of the five
    best drawn by score."""
    asked = set(query_tokens(question))
    pattern = _answer_pattern(question)
    used = {str(h["clue"]).lower() for h in hops if h["clue"]}
    scores: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for depth, hop in enumerate(hops):
        weight = 1 + depth * 2  # later hops are closer to the answer
        sources = {d: (t, 3 * weight) for d, t in hop["texts"].items()}
        for hit in hop["hits"][:5]:
            sources.setdefault(hit["docid"], (f"{hit['title']}. {hit['excerpt']}", weight))
        for docid, (text, w) in sources.items():
            focus = set(keywords) | set(hop["keywords"])
            for sentence in _sentences(text):
                near = len(set(query_tokens(sentence)) & focus)
                for candidate in pattern.findall(sentence) if near else []:
                    candidate = re.sub(r"['’]s$", "", candidate.strip(" ,."))
                    tokens = query_tokens(candidate)
                    if (
                        not tokens
                        or set(tokens) <= asked
                        or candidate.lower() in used
                        or candidate.startswith(_BOILERPLATE)
                    ):
                        continue
                    scores[candidate] += near * w
                    where.setdefault(candidate, [])
                    if docid not in where[candidate]:
                        where[candidate].append(docid)
    _merge_short_names(scores, where)
    if not scores:
        return PolicyReply(
            content="Explanation: The documents I read did not name an answer.\n"
            "Exact Answer: unknown\nConfidence: 5%"
        )
    ranked = scores.most_common(5 if sampling is not None else 2)
    best, top = ranked[0] if sampling is None else sampling.pick(ranked)
    runner_up = max((score for name, score in ranked if name != best), default=0)
    confidence = max(10, min(90, int(100 * top / (top + runner_up + 1))))
    cites = " ".join(f"[{d}]" for d in where[best][:3])
    return PolicyReply(
        content=f"Explanation: {best} appears most often next to the question's words {cites}.\n"
        f"Exact Answer: {best}\nConfidence: {confidence}%"
    )


def _merge_short_names(scores: Counter[str], where: dict[str, list[str]]) -> None:
    """Credit "Hall" to "G. Stanley Hall" when both occur: texts shorten names they repeat."""
    names = sorted(scores, key=len, reverse=True)
    for short in names:
        longer = [n for n in names if n != short and n.endswith(" " + short) and scores[n] > 0]
        if longer:
            best = max(longer, key=lambda n: scores[n])
            scores[best] += scores.pop(short)
            where[best] += [d for d in where.pop(short) if d not in where[best]]


def _answer_pattern(question: str) -> re.Pattern[str]:
    lower = question.lower()
    if "how many" in lower or "how much" in lower or "number of" in lower:
        return _NUMBER
    if "what year" in lower or "which year" in lower or lower.startswith("when"):
        return _DATE
    return _NAME


def tool_reply(name: str, reason: str, **arguments: Any) -> PolicyReply:
    return PolicyReply(tool_calls=[_tool_call(name, reason, **arguments)])


def _tool_call(name: str, reason: str, **arguments: Any) -> PolicyToolCall:
    return PolicyToolCall(
        name=name, arguments=orjson.dumps({"reason": reason, **arguments}).decode()
    )
