"""The ReAct agent: prompt, answer parsing, budget clock and the loop (docs/spec.md §4)."""

from piserini_ray.agent.answer import ParsedAnswer, parse_final_answer
from piserini_ray.agent.budget import BudgetClock
from piserini_ray.agent.loop import run_query

__all__ = ["BudgetClock", "ParsedAnswer", "parse_final_answer", "run_query"]
