"""The judge's templates (docs/spec.md §6): the prompt it is sent and how its reply is read.

`piserini` (ours): a JSON object with `correct` (bool), `confidence` (0-100), a non-empty
`reasoning` and a non-empty `correct_answer`, anything else a parse error. `browsecomp-plus`:
BrowseComp-Plus's grader prompt verbatim, the reply read as their evaluator does
(`parse_browsecomp_plus`: the confidence the judge extracts from the response; only a missing
`correct` is a parse error).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import orjson

from piserini_ray.data import Query

JUDGE_PROMPT = """\
Decide whether the [response] below answers the [question] correctly, given the [correct_answer].

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}
{accepted}
Reply with one JSON object and nothing else, with these fields:
"extracted_final_answer": the exact final answer taken from the response, or null if it has none;
"correct_answer": the correct answer as given above;
"reasoning": why the extracted answer does or does not match the correct answer. Semantic
equivalence counts as correct; harmless differences of wording or format, added correct detail
and small differences of numeric formatting are allowed. No extractable answer is incorrect;
"correct": true or false;
"confidence": your confidence in this verdict, from 0 to 100."""

_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$", re.I)

#: BrowseComp-Plus's grader prompt, verbatim (a raw string keeps their `\%`): `GRADER_TEMPLATE`
#: of scripts_evaluation/evaluate_run.py in github.com/texttron/BrowseComp-Plus at 97c637c
#: (identical at b90a68c). Their evaluator fills it with .format(question, response,
#: correct_answer) and sends it as the one user message, with no response format.
BROWSECOMP_PLUS_GRADER = r"""
Judge whether the following [response] to [question] is correct or not based on the precise and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. 

[correct_answer]: Repeat the [correct_answer] given above.

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], in the context of this [question]. You should judge whether the extracted_final_answer is semantically equivalent to [correct_answer], allowing the extracted_final_answer to be string variations of [correct_answer]. You should also allow the extracted_final_answer to be more precise or verbose than [correct_answer], as long as its additional details are correct. Do not comment on any background to the problem, do not attempt to solve the problem, do not argue for any answer different than [correct_answer], focus only on whether the answers are semantically equivalent.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin of error for numerical problems. Answer 'no' otherwise, i.e. if there if there is any inconsistency, ambiguity, non-equivalency, or if the extracted answer is incorrect.


confidence: The extracted confidence score between 0|\%| and 100|\%| from [response]. Put 100 if there is no confidence score available.
""".strip()  # noqa: E501, W291 (their text, verbatim)

Template = Literal["piserini", "browsecomp-plus"]

# Their parse_judge_response's patterns, in their order (bold first, then plain), same flags.
_BCP_ANSWER = [
    re.compile(r"\*\*extracted_final_answer:\*\*\s*(.*?)(?=\n|$)", re.I | re.S),
    re.compile(r"\*\*extracted_final_answer\*\*:\s*(.*?)(?=\n|$)", re.I | re.S),
    re.compile(r"extracted_final_answer:\s*(.*?)(?=\n|$)", re.I | re.S),
]
_BCP_REASONING = [
    re.compile(
        r"\*\*reasoning:\*\*\s*(.*?)(?=\n\*\*correct:\*\*|\n\*\*correct\*\*:|\ncorrect:|$)",
        re.I | re.S,
    ),
    re.compile(
        r"\*\*reasoning\*\*:\s*(.*?)(?=\n\*\*correct:\*\*|\n\*\*correct\*\*:|\ncorrect:|$)",
        re.I | re.S,
    ),
    re.compile(r"reasoning:\s*(.*?)(?=\ncorrect:|$)", re.I | re.S),
]
_BCP_CORRECT = [
    re.compile(r"\*\*correct:\*\*\s*(yes|no)", re.I),
    re.compile(r"\*\*correct\*\*:\s*(yes|no)", re.I),
    re.compile(r"correct:\s*(yes|no)", re.I),
]
_BCP_CONFIDENCE = [
    re.compile(r"\*\*confidence:\*\*\s*(\d+(?:\.\d+)?)\s*%?", re.I),
    re.compile(r"\*\*confidence\*\*:\s*(\d+(?:\.\d+)?)\s*%?", re.I),
    re.compile(r"confidence:\s*(\d+(?:\.\d+)?)\s*%?", re.I),
]


def _first(patterns: list[re.Pattern[str]], text: str) -> re.Match[str] | None:
    return next((m for p in patterns if (m := p.search(text))), None)


def parse_browsecomp_plus(content: str | None, correct_answer: str) -> dict[str, Any]:
    """A reply to `BROWSECOMP_PLUS_GRADER` read as their `parse_judge_response` reads it
    (evaluate_run.py, 97c637c): the first bold or plain `extracted_final_answer:`, `reasoning:`
    (up to the `correct:` line), `correct: yes|no` and `confidence: N` (capped at 100). As
    theirs, only a missing `correct` is a parse error; a missing confidence is kept as None
    (their calibration leaves such an answer out). `correct_answer` is the gold we gave: their
    parser does not read the judge's repetition of it."""
    text = content or ""
    correct = _first(_BCP_CORRECT, text)
    if not text or correct is None:
        raise JudgeParseError(f"no `correct: yes|no` line: {text[:200]!r}")
    answer = _first(_BCP_ANSWER, text)
    reasoning = _first(_BCP_REASONING, text)
    confidence = _first(_BCP_CONFIDENCE, text)
    return {
        "correct": correct.group(1).lower() == "yes",
        "confidence": None if confidence is None else min(100.0, float(confidence.group(1))),
        "reasoning": None if reasoning is None else reasoning.group(1).strip(),
        "correct_answer": correct_answer,
        "extracted_final_answer": None if answer is None else answer.group(1).strip(),
        "template": "browsecomp-plus",
    }


def response_format(template: Template) -> dict[str, Any] | None:
    """Ours asks for JSON; their evaluator sends its prompt with no response format."""
    return {"type": "json_object"} if template == "piserini" else None


def format_field(template: Template) -> dict[str, Any]:
    wanted = response_format(template)
    return {} if wanted is None else {"response_format": wanted}


def parse_verdict(content: str | None, template: Template, query: Query) -> dict[str, Any]:
    """The verdict fields of a reply to `template`'s prompt, or `JudgeParseError`."""
    if template == "browsecomp-plus":
        return parse_browsecomp_plus(content, query.answer)
    return parse_judgement(content)


class JudgeParseError(ValueError):
    pass


def judge_messages(
    query: Query, response: str, template: Template = "piserini"
) -> list[dict[str, Any]]:
    if template == "browsecomp-plus":  # theirs, filled as their create_judge_prompt does
        prompt = BROWSECOMP_PLUS_GRADER.format(
            question=query.query, response=response, correct_answer=query.answer
        )
        return [{"role": "user", "content": prompt}]
    accepted = f"[accepted_answers]: {' | '.join(query.aliases)}\n" if query.aliases else ""
    prompt = JUDGE_PROMPT.format(
        question=query.query, response=response, correct_answer=query.answer, accepted=accepted
    )
    return [{"role": "user", "content": prompt}]


def parse_judgement(content: str | None) -> dict[str, Any]:
    """The verdict fields, or `JudgeParseError` saying what is wrong."""
    text = _FENCE.sub("", content or "").strip()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise JudgeParseError(f"not JSON ({e}): {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise JudgeParseError(f"not a JSON object: {text[:200]!r}")
    if not isinstance(data.get("correct"), bool):
        raise JudgeParseError("`correct` is missing or not true/false")
    confidence = data.get("confidence")
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise JudgeParseError("`confidence` is missing or not a number")
    for field in ("reasoning", "correct_answer"):
        if not isinstance(data.get(field), str) or not data[field].strip():
            raise JudgeParseError(f"`{field}` is missing or empty")
    extracted = data.get("extracted_final_answer")
    if extracted is not None and not isinstance(extracted, str):
        extracted = str(extracted)
    return {
        "correct": data["correct"],
        "confidence": min(100.0, max(0.0, float(confidence))),
        "reasoning": data["reasoning"],
        "correct_answer": data["correct_answer"],
        "extracted_final_answer": extracted,
    }
