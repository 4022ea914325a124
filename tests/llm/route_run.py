"""One sample query through the agent loop on a model route, for the route tests."""

from __future__ import annotations

import asyncio

from piserini_ray.agent.loop import run_query
from piserini_ray.config import AgentConfig, ModelConfig, RetryConfig
from piserini_ray.data import Benchmark
from piserini_ray.llm.client import LLMClient
from piserini_ray.records import QueryRecord
from piserini_ray.tools import ToolSession, tool_schemas

#: A sample question the long-horizon policy works at for more than 6 turns.
QUESTION_ID = "2hop__150763_14904"


def run_sample_query(searcher, sample: Benchmark, model: ModelConfig) -> QueryRecord:
    """The agent on `model` over the sample index, litellm's one attempt per call."""
    return asyncio.run(
        run_query(
            sample.query(QUESTION_ID),
            ToolSession(searcher),
            LLMClient(model, RetryConfig(max_attempts=1), seed=1),
            AgentConfig(),
            tool_schemas(),
            run_id="r",
            config_hash="h",
        )
    )
