"""OpenAI-style function schemas of the three tools (what the model is told it can call)."""

from __future__ import annotations

from typing import Any

from piserini_ray.config import ToolsConfig

_REASON = {
    "type": "string",
    "description": "Why you make this call: a short rationale, at most 100 words. Always first.",
}


def tool_schemas(config: ToolsConfig = ToolsConfig()) -> list[dict[str, Any]]:
    """The `tools` list of a chat-completions request, with the configured defaults."""
    return [
        _function(
            "search",
            "Search the document collection with BM25 (a bag of words: no operators, quotes or "
            f"fields). Caches the whole ranking under a new id (s1, s2, ...) and shows ranks "
            f"1-{config.first_page}. Prefer short lexical queries.",
            {
                "reason": _REASON,
                "query": {"type": "string", "description": "The search words."},
            },
            ["reason", "query"],
        ),
        _function(
            "read_search_results",
            "Page through a cached ranking without searching again. Browse a ranking before "
            "rewriting the query.",
            {
                "reason": _REASON,
                "search_id": {"type": "string", "description": "A live search id, e.g. s1."},
                "offset": {
                    "type": "integer",
                    "description": f"First rank to show (1-based, default {config.browse_offset}).",
                    "minimum": 1,
                },
                "limit": {
                    "type": "integer",
                    "description": f"How many hits (default {config.browse_limit}, "
                    f"at most {config.max_browse_limit}).",
                    "minimum": 1,
                    "maximum": config.max_browse_limit,
                },
            },
            ["reason", "search_id"],
        ),
        _function(
            "read_document",
            "Read lines of a document by docid. Start at offset 1 with a moderate limit and "
            "continue while it stays relevant.",
            {
                "reason": _REASON,
                "docid": {"type": "string", "description": "A docid as shown in search results."},
                "offset": {
                    "type": "integer",
                    "description": f"First line (1-based, default {config.doc_offset}).",
                    "minimum": 1,
                },
                "limit": {
                    "type": "integer",
                    "description": f"How many lines (default {config.doc_limit}, "
                    f"at most {config.max_doc_limit}).",
                    "minimum": 1,
                    "maximum": config.max_doc_limit,
                },
            },
            ["reason", "docid"],
        ),
    ]


def _function(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }
