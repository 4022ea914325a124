"""Token counting for the offline provider: a real tokenizer and one documented rule.

The tokenizer is tiktoken's `cl100k_base`, read from the copy litellm ships (no network). We point
`TIKTOKEN_CACHE_DIR` at that copy exactly as `litellm.litellm_core_utils.default_encoding` does,
without importing litellm itself (that import costs seconds and tries to fetch a price map).

The counting rule (deterministic, close to OpenAI's published accounting):

- a message costs `MESSAGE_OVERHEAD` (3) + tokens(role) + tokens(content text: the string, or the
  concatenated `text` parts of a list) + for each tool call tokens(function name) +
  tokens(arguments) + tokens(`tool_call_id`) and tokens(`name`) when present;
- a prompt costs the sum over its messages + tokens(compact JSON of `tools`, when given) +
  `REPLY_PRIMING` (3);
- a completion costs tokens(content) + for each tool call tokens(name) + tokens(arguments).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import orjson
import tiktoken

ENCODING_NAME = "cl100k_base"
MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3
_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def bundled_tokenizer_dir() -> Path:
    """The tokenizer files inside the installed litellm package (found without importing it)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("litellm is not installed: it ships the offline tokenizer files")
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


@cache
def encoding() -> tiktoken.Encoding:
    """`cl100k_base`, loaded from disk only; fails loudly instead of reaching for the network."""
    # Same choice as litellm's default_encoding module, so whichever is imported first, the
    # process ends up with one consistent cache directory.
    cache_dir = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR") or str(bundled_tokenizer_dir())
    os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir
    cached = Path(cache_dir) / hashlib.sha1(_CL100K_URL.encode()).hexdigest()
    if not cached.is_file():
        raise RuntimeError(
            f"tokenizer file {cached} is missing; reinstall litellm (it bundles {ENCODING_NAME}) "
            "or set CUSTOM_TIKTOKEN_CACHE_DIR to a directory holding it"
        )
    return tiktoken.get_encoding(ENCODING_NAME)


def count_text_tokens(text: str | None) -> int:
    """Tokens of plain text; special-token strings such as `<|endoftext|>` count as text."""
    return _count_tokens(text) if text else 0


# Every request re-sends the whole conversation, and the server counts it twice (prompt and
# cached prefix): remembering recent texts makes a 40-call conversation cost its new message,
# not its whole history, in tokenizer time.
@lru_cache(maxsize=8192)
def _count_tokens(text: str) -> int:
    return len(encoding().encode_ordinary(text))


def content_text(content: Any) -> str:
    """The text of a message's content: the string itself, or the joined text parts of a list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return str(content)


def _tool_call_tokens(tool_calls: Iterable[Any] | None) -> int:
    total = 0
    for call in tool_calls or ():
        if not isinstance(call, Mapping):
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = orjson.dumps(arguments).decode()  # some clients send a dict
        total += count_text_tokens(function.get("name")) + count_text_tokens(arguments)
    return total


def count_message_tokens(message: Mapping[str, Any]) -> int:
    """One message's tokens under the rule in the module docstring (overhead included)."""
    total = MESSAGE_OVERHEAD + count_text_tokens(message.get("role"))
    total += count_text_tokens(content_text(message.get("content")))
    total += _tool_call_tokens(message.get("tool_calls"))
    for field in ("tool_call_id", "name"):
        value = message.get(field)
        if isinstance(value, str):
            total += count_text_tokens(value)
    return total


def count_prompt_tokens(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
) -> int:
    """A request's prompt tokens: messages + compact JSON of `tools` + `REPLY_PRIMING`."""
    total = sum(count_message_tokens(m) for m in messages) + REPLY_PRIMING
    if tools:
        total += count_text_tokens(orjson.dumps(list(tools)).decode())
    return total


def count_completion_tokens(content: str | None, tool_calls: Iterable[Any] | None = None) -> int:
    """A reply's tokens: content + each tool call's name and arguments (OpenAI wire format)."""
    return count_text_tokens(content) + _tool_call_tokens(tool_calls)
