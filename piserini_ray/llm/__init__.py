"""LLM calls through litellm with one classified retry policy."""

from piserini_ray.llm.client import Completion, LLMClient
from piserini_ray.llm.retry import Failure, FailureKind, RetryError, classify
from piserini_ray.records import Usage

__all__ = ["Completion", "Failure", "FailureKind", "LLMClient", "RetryError", "Usage", "classify"]
