"""`offline/exact-match-judge`: a deterministic stand-in for the LLM judge, and two judges that
disagree with it in a controlled way, for rehearsing judge agreement: `offline/strict-judge`
(exact after normalisation, or the same number; no containment) and `offline/lenient-judge`
(also partial answers and any containment; see `LENIENT`).

It reads the judge prompt in the last user message, whose fields start lines:

    [question]: ...
    [response]: ...            (may span many lines, up to the next marker)
    [correct_answer]: ...      (one line)
    [accepted_answers]: a | b  (optional, one line: aliases)

takes the final answer from the response's `Exact Answer:` line and replies with the JSON of a
judgement, decided by normalised string and numeric matching (see `match_rule`).

BrowseComp-Plus's grader prompt (`judge.template: browsecomp-plus`) carries the same markers
and asks for plain lines instead: the reply is then `extracted_final_answer:`, `[correct_answer]:`,
`reasoning:`, `correct: yes|no` and `confidence:` (the response's own last `Confidence:` value,
100 when it has none, as that prompt asks), in the order their parser reads.
"""

from __future__ import annotations

import json
import re
import string
import unicodedata
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from piserini_ray.offline.policy import PolicyReply
from piserini_ray.offline.tokens import content_text

#: Extra tokens an extracted answer may carry around the gold answer and still count as correct
#: ("Paris, France" for "Paris"); more than this is a different answer, not a harmless addition.
MAX_EXTRA_TOKENS = 3

_ARTICLES = frozenset({"a", "an", "the"})
# Removed rather than turned into spaces, so "U.S.A." = "USA" and "O'Brien" = "OBrien".
_ELIDED = frozenset(".'’ʼ")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
_MARKER = re.compile(r"^\[(question|response|correct_answer|accepted_answers)\]:[ \t]*", re.M)
# "Exact Answer: x", "**Exact Answer:** x", "**Exact answer**: x", "- exact answer: x", ...
_EXACT = re.compile(r"^[\s>*_#\-]*exact[ \t]+answer[\s*_]*:[\s*_]*(.*)$", re.I)
_FIELD = re.compile(r"^[\s>*_#\-]*(explanation|confidence|exact[ \t]+answer)[\s*_]*:", re.I)
_CONFIDENCE = re.compile(r"^[\s>*_#\-]*confidence[\s*_]*:[\s*_]*(-?\d+(?:\.\d+)?)", re.I | re.M)
# A line only BrowseComp-Plus's grader prompt has: it asks for plain lines, not JSON.
_BCP_PROMPT = re.compile(r"^extracted_final_answer: The final exact answer", re.M)


def _is_punctuation(ch: str) -> bool:
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


def _canonical_number(token: str) -> str:
    """`35.0` -> `35`, `0.50` -> `0.5`; other tokens unchanged."""
    if not _NUMBER.fullmatch(token):
        return token
    return format(Decimal(token).normalize(), "f")


def normalize_answer(text: str) -> str:
    """NFKC, lower case, no punctuation, no articles, single spaces, canonical numbers.

    Thousands separators and decimal points inside numbers survive punctuation stripping, so
    "1,000" becomes "1000" and "3.5" stays "3.5"; a percent sign is punctuation ("35%" = "35").
    """
    s = _THOUSANDS.sub("", unicodedata.normalize("NFKC", text).lower())
    out: list[str] = []
    for i, ch in enumerate(s):
        if ch == "." and 0 < i < len(s) - 1 and s[i - 1].isdigit() and s[i + 1].isdigit():
            out.append(ch)
        elif ch in _ELIDED:
            continue
        elif _is_punctuation(ch):
            out.append(" ")
        else:
            out.append(ch)
    tokens = [t for t in "".join(out).split() if t not in _ARTICLES]
    return " ".join(_canonical_number(t) for t in tokens)


def parse_number(text: str) -> Decimal | None:
    """The number a whole answer states ("1,000", "35.0", "12%"), or None when it is not one."""
    s = _THOUSANDS.sub("", unicodedata.normalize("NFKC", text).strip())
    s = s.removesuffix("%").strip()
    if not _NUMBER.fullmatch(s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        return None


Strictness = Literal["strict", "exact-match", "lenient"]


def _contains(outer: list[str], inner: list[str]) -> bool:
    return any(outer[i : i + len(inner)] == inner for i in range(len(outer) - len(inner) + 1))


def match_rule(extracted: str, gold: str, strictness: Strictness = "exact-match") -> str | None:
    """Which rule makes `extracted` match `gold`, if any: "numeric", "normalised", and by
    strictness "contained" (exact-match: the gold plus at most 3 extra words; lenient: any
    number), "partial" (lenient: the answer is a part of the gold, "Paris" for "Paris, France")
    or "overlap" (lenient: at least half of the gold's words).

    When both are numbers the numeric comparison alone decides, so "1000" never matches
    "10000" through the containment rule.
    """
    x_num, g_num = parse_number(extracted), parse_number(gold)
    if x_num is not None and g_num is not None:
        return "numeric" if x_num == g_num else None
    x, g = normalize_answer(extracted).split(), normalize_answer(gold).split()
    if not g or not x:
        return None
    if x == g:
        return "normalised"
    if strictness == "strict":
        return None
    extra = len(x) - len(g)
    limit = MAX_EXTRA_TOKENS if strictness == "exact-match" else len(x)
    if 0 < extra <= limit and _contains(x, g):
        return "contained"
    if strictness == "lenient":
        if len(x) < len(g) and _contains(g, x):
            return "partial"
        if 2 * len(set(g) & set(x)) >= len(set(g)):
            return "overlap"
    return None


def answers_match(extracted: str, gold: str) -> bool:
    """True when `extracted` answers `gold` under `match_rule` (exact-match strictness)."""
    return match_rule(extracted, gold) is not None


def parse_judge_prompt(prompt: str) -> dict[str, str]:
    """The marker fields of a judge prompt; `correct_answer`/`accepted_answers` are one line."""
    fields: dict[str, str] = {}
    found = list(_MARKER.finditer(prompt))
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(prompt)
        value = prompt[match.end() : end]
        if match.group(1) in ("correct_answer", "accepted_answers"):
            value = value.split("\n", 1)[0]
        fields.setdefault(match.group(1), value.strip())
    return fields


def _strip_markup(text: str) -> str:
    return text.strip().strip("*_`").strip()


def extract_exact_answer(response: str) -> str | None:
    """The value of the response's last `Exact Answer:` line (markdown tolerated), or None."""
    lines = response.splitlines()
    answer = None
    for i, line in enumerate(lines):
        match = _EXACT.match(line)
        if not match:
            continue
        value = _strip_markup(match.group(1))
        if not value:  # "Exact Answer:" alone, the answer on the next non-empty line
            following = next((x for x in lines[i + 1 :] if x.strip()), "")
            value = "" if _FIELD.match(following) else _strip_markup(following)
        answer = value or None
    return answer


def judge(prompt: str, strictness: Strictness = "exact-match") -> dict[str, Any]:
    """The judgement for one judge prompt (see the module docstring for its format)."""
    fields = parse_judge_prompt(prompt)
    gold = fields.get("correct_answer", "")
    aliases = [a.strip() for a in fields.get("accepted_answers", "").split("|") if a.strip()]
    verdict: dict[str, Any] = {
        "extracted_final_answer": None,
        "correct_answer": gold,
        "reasoning": "",
        "correct": False,
        "confidence": 100,
    }
    if not gold:
        verdict["reasoning"] = "The judge prompt has no [correct_answer] line; cannot judge."
        verdict["confidence"] = 0
        return verdict
    extracted = extract_exact_answer(fields.get("response", ""))
    verdict["extracted_final_answer"] = extracted
    if extracted is None:
        verdict["reasoning"] = "The response has no 'Exact Answer:' line, so no final answer."
        return verdict
    for candidate in [gold, *aliases]:
        rule = match_rule(extracted, candidate, strictness)
        if rule is None:
            continue
        which = "the correct answer" if candidate == gold else "the accepted answer"
        explanation = {
            "numeric": "states the same number as",
            "normalised": "equals, after normalisation (case, punctuation, articles, spaces),",
            "contained": "contains"
            + (
                "" if strictness == "lenient" else f", with at most {MAX_EXTRA_TOKENS} extra words,"
            ),
            "partial": "is a part of",
            "overlap": "shares at least half the words of",
        }[rule]
        verdict["reasoning"] = f"The extracted answer {extracted!r} {explanation} {which} "
        verdict["reasoning"] += f"{candidate!r} (rule: {rule})."
        verdict["correct"] = True
        return verdict
    names = ", ".join(repr(c) for c in [gold, *aliases])
    verdict["reasoning"] = (
        f"The extracted answer {extracted!r} matches none of {names} ({strictness} rules)."
    )
    return verdict


def stated_confidence(response: str) -> float:
    """The response's last `Confidence:` value, sign kept then clamped to 0-100; 100 when it
    states none (what BrowseComp-Plus's grader prompt asks the judge to extract)."""
    found = _CONFIDENCE.findall(response)
    return 100.0 if not found else min(100.0, max(0.0, float(found[-1])))


def browsecomp_plus_reply(prompt: str, strictness: Strictness = "exact-match") -> str:
    """The judgement of a BrowseComp-Plus grader prompt, in the lines that prompt asks for."""
    verdict = judge(prompt, strictness)
    response = parse_judge_prompt(prompt).get("response", "")
    return (
        f"extracted_final_answer: {verdict['extracted_final_answer'] or 'None'}\n\n"
        f"[correct_answer]: {verdict['correct_answer']}\n\n"
        f"reasoning: {verdict['reasoning']}\n\n"
        f"correct: {'yes' if verdict['correct'] else 'no'}\n\n"
        f"confidence: {stated_confidence(response):g}"
    )


def _last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def judge_policy(strictness: Strictness) -> Callable[[dict[str, Any]], PolicyReply]:
    """A policy judging the last user message; the content is JSON (also under
    `response_format`), or the lines of BrowseComp-Plus's grader when that is the prompt."""

    def policy(request: dict[str, Any]) -> PolicyReply:
        prompt = _last_user_text(request)
        if _BCP_PROMPT.search(prompt):
            return PolicyReply(content=browsecomp_plus_reply(prompt, strictness))
        verdict = judge(prompt, strictness)
        return PolicyReply(content=json.dumps(verdict, ensure_ascii=False))

    return policy


exact_match_judge_policy = judge_policy("exact-match")

#: The offline judges by model name.
JUDGES: dict[str, Callable[[dict[str, Any]], PolicyReply]] = {
    "offline/exact-match-judge": exact_match_judge_policy,
    "offline/strict-judge": judge_policy("strict"),
    "offline/lenient-judge": judge_policy("lenient"),
}
