"""The agent's three tools (search, read_search_results, read_document), docs/spec.md §3."""

from piserini_ray.tools.schemas import tool_schemas
from piserini_ray.tools.session import BLOCKED_MESSAGE, TOOL_NAMES, Backend, ToolResult, ToolSession

__all__ = ["BLOCKED_MESSAGE", "TOOL_NAMES", "Backend", "ToolResult", "ToolSession", "tool_schemas"]
