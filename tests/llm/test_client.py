"""What the agent's first call with tools loads: a replica's first query must not wait on
litellm's MCP gateway (seconds of imports on a busy node), since our tools are functions."""

import textwrap

from helpers import fresh_python

#: A fresh process (no other test has imported anything there): the agent's call with the
#: three tools, through `LLMClient`, to the offline provider on loopback.
PROGRAM = textwrap.dedent(
    """
    import asyncio, sys
    from pydantic import SecretStr
    from piserini_ray.config import ModelConfig, OfflineConfig, RetryConfig, ToolsConfig
    from piserini_ray.llm.client_builder import build_client
    from piserini_ray.offline.server import OfflineProvider
    from piserini_ray.tools import tool_schemas

    offline = OfflineConfig(model_aliases={"gpt-5.4-mini": "offline/heuristic"})
    model = ModelConfig(name="gpt-5.4-mini", litellm_model="openai/gpt-5.4-mini")
    tools = tool_schemas(ToolsConfig())
    with OfflineProvider(offline) as provider:
        client = build_client(
            model, RetryConfig(max_attempts=1), offline, api_base=provider.base_url,
            limiters=None, keys={"OPENAI_API_KEY": SecretStr("sk-test")},
        )
        question = [{"role": "user", "content": "Who kept the lighthouse? Search first."}]
        completion = asyncio.run(client.complete(question, tools=tools))
        seen = provider.requests[-1]
    assert seen.status == 200 and seen.tools == tools, seen
    assert completion.tool_calls, completion
    gateway = "litellm.responses.mcp.chat_completions_handler"
    print("MCP gateway loaded" if gateway in sys.modules else "no MCP gateway")
    """
)


def test_a_call_with_function_tools_reaches_the_provider_without_loading_the_mcp_gateway() -> None:
    out = fresh_python(PROGRAM)
    assert out.strip().splitlines()[-1] == "no MCP gateway", out
