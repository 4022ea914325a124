"""The `offline/long-horizon` model: the heuristic's moves, stretched to the paper's lengths.

Agents in the paper make 10 to 40 tool calls per question; `offline/heuristic` makes about 8.
This policy makes a number of calls drawn from the question's hash (`planned_calls`, uniform in
10..40), one per turn, cycling search -> browse the next page -> open two unseen hits, each search
using a different window of the question's words. Then it answers exactly as the heuristic does.
Like every policy it decides from the conversation alone, so a repeated request gets the same reply.

It exists for rehearsals and benchmarks that need the paper's conversation shape: long histories
(prefix caching), many requests per query (quotas, scheduler efficiency).
"""

from __future__ import annotations

import hashlib
from typing import Any

from piserini_ray.offline.heuristic import (
    QUESTION_WORDS,
    answer_from,
    hops_so_far,
    must_answer,
    question_of,
    rank_hits,
    tool_reply,
)
from piserini_ray.offline.policy import PolicyReply
from piserini_ray.tools.excerpt import query_tokens

MIN_CALLS, MAX_CALLS = 10, 40


def planned_calls(question: str) -> int:
    """Tool calls this question gets: uniform in [MIN_CALLS, MAX_CALLS], fixed by its text."""
    digest = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16)
    return MIN_CALLS + digest % (MAX_CALLS - MIN_CALLS + 1)


def long_horizon_policy(request: dict[str, Any]) -> PolicyReply:
    messages: list[dict[str, Any]] = request.get("messages") or []
    question = question_of(messages)
    keywords = [t for t in query_tokens(question) if t not in QUESTION_WORDS][:12]
    hops = hops_so_far(messages)
    made = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
    if must_answer(messages) or not keywords or made >= planned_calls(question):
        return answer_from(question, keywords, hops)
    hop = hops[-1] if hops else None
    if hop is not None and hop["search_id"] and not hop["browsed"]:
        return tool_reply(
            "read_search_results",
            "Browse below the first page.",
            search_id=hop["search_id"],
            offset=6,
            limit=10,
        )
    if hop is not None and len(hop["opened"]) < 2:
        opened = {d for h in hops for d in h["opened"]}
        fresh = [h for h in rank_hits(hop["hits"], hop["keywords"]) if h["docid"] not in opened]
        if fresh:
            docid = fresh[0]["docid"]
            return tool_reply(
                "read_document", f"Open a promising hit ({docid}).", docid=docid, offset=1, limit=50
            )
    # A new search over a different window of the question's words (wrapping around).
    start = len(hops) % len(keywords)
    window = (keywords[start:] + keywords[:start])[: max(3, len(keywords) - len(hops) % 4)]
    return tool_reply(
        "search", "Search another combination of the question's words.", query=" ".join(window)
    )
