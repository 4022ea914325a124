"""Token usage of one call, as providers report it (OpenAI and Anthropic field names), and the
local count of a prompt no provider reported (a call cut at the budget or failed after it was
sent): with the model's own tokenizer where litellm ships one, never downloading one."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from piserini_ray.records import Usage


def _get(obj: Any, *names: str) -> int:
    """The first of `names` present on `obj` (attribute or key) as an int, else 0."""
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if isinstance(value, int | float):
            return int(value)
    return 0


def usage_from_response(response: Any) -> Usage:
    """Read litellm's `response.usage` (OpenAI shape, with Anthropic cache fields if present)."""
    return usage_from(getattr(response, "usage", None) or {})


def usage_from(usage: Any) -> Usage:
    """A usage block (litellm's object, or a chat completion's `usage` as a dict)."""
    details = (
        usage.get("prompt_tokens_details") if isinstance(usage, dict)
        else getattr(usage, "prompt_tokens_details", None)
    ) or {}  # fmt: skip
    completion_details = (
        usage.get("completion_tokens_details") if isinstance(usage, dict)
        else getattr(usage, "completion_tokens_details", None)
    ) or {}  # fmt: skip
    written = (
        details.get("cache_creation_token_details") if isinstance(details, dict)
        else getattr(details, "cache_creation_token_details", None)
    ) or {}  # fmt: skip
    return Usage(
        input_tokens=_get(usage, "prompt_tokens", "input_tokens"),
        output_tokens=_get(usage, "completion_tokens", "output_tokens"),
        cached_tokens=_get(details, "cached_tokens") or _get(usage, "cache_read_input_tokens"),
        cache_write_tokens=_get(usage, "cache_creation_input_tokens"),
        cache_write_1h_tokens=_get(written, "ephemeral_1h_input_tokens"),
        reasoning_tokens=_get(completion_details, "reasoning_tokens"),
    )


def usage_reported(response: Any) -> bool:
    """Whether the provider reported usage. litellm fills a missing block with zeros, and a
    real call always counts some prompt tokens, so all-zero means "not reported"."""
    usage = usage_from_response(response)
    return usage.input_tokens > 0 or usage.output_tokens > 0


# ---------------------------------------------------------------- prompts no provider counted

#: tiktoken's files for the encodings litellm ships in `litellm_core_utils/tokenizers`.
_TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"


def bare_model(litellm_model: str) -> str:
    """The model's name without its litellm route (`openai/gpt-5` -> `gpt-5`), the form
    litellm's tokenizer tables know."""
    import litellm

    try:
        return str(litellm.get_llm_provider(litellm_model)[0])
    except Exception:  # an unknown route: the name as it is
        return litellm_model


def local_tokenizer(litellm_model: str) -> str | None:
    """The tokenizer `litellm.token_counter` uses for the model when it is the model's own and
    one litellm ships with the package, so that counting never downloads: Anthropic's (its
    bundled JSON) or the tiktoken encoding of an OpenAI model whose file is on disk. None
    otherwise: a model litellm does not know (it would count with a stand-in), or one whose
    tokenizer it would fetch from the Hugging Face hub (Llama, Command R)."""
    import litellm
    from litellm.litellm_core_utils.token_counter import openai_tokenizer_encoding_name
    from litellm.utils import huggingface_tokenizer_kind

    if litellm.disable_token_counter:
        return None
    model = bare_model(litellm_model)
    kind = huggingface_tokenizer_kind(model)
    if kind == "anthropic":
        # litellm counts with it only with `tokenizers` installed and HF tokenizers allowed
        # (else it falls back to tiktoken's cl100k_base, which is no Claude tokenizer).
        usable = not litellm.disable_hf_tokenizer_download
        return "anthropic" if usable and importlib.util.find_spec("tokenizers") else None
    if kind is not None or model not in litellm.open_ai_chat_completion_models:
        return None
    name = openai_tokenizer_encoding_name(model)
    return name if _tiktoken_on_disk(name) else None


def _tiktoken_on_disk(name: str) -> bool:
    """Whether tiktoken will read encoding `name` from disk (an encoding it loaded already, or
    its file in the cache directory litellm points it at) instead of downloading it."""
    # litellm's module that points TIKTOKEN_CACHE_DIR at its bundled files (unless the user
    # chose a directory with CUSTOM_TIKTOKEN_CACHE_DIR): the directory tiktoken then reads.
    import litellm.litellm_core_utils.default_encoding  # noqa: F401
    import tiktoken.registry

    if name in getattr(tiktoken.registry, "ENCODINGS", {}):
        return True
    folder = os.environ.get("TIKTOKEN_CACHE_DIR")
    key = hashlib.sha1(_TIKTOKEN_URL.format(name).encode()).hexdigest()
    return bool(folder) and os.path.isfile(os.path.join(folder or "", key))


def count_prompt(
    litellm_model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[int, str] | None:
    """(prompt tokens, `tokenizer <name>`) counted by `litellm.token_counter` with the model's
    own tokenizer, messages and tool definitions as litellm prices them; None when litellm has
    no local tokenizer for the model (`local_tokenizer`) or cannot count this prompt."""
    name = local_tokenizer(litellm_model)
    if name is None:
        return None
    import litellm

    try:
        tokens = litellm.token_counter(
            model=bare_model(litellm_model),
            messages=messages,
            tools=tools or None,  # type: ignore[arg-type]  # litellm types them as TypedDicts
            use_default_image_token_count=True,  # never fetch an image to measure it
        )
    except Exception:
        return None
    return (int(tokens), f"tokenizer {name}") if tokens > 0 else None


def character_estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """A prompt's tokens at about 4 characters a token (its JSON: messages and tools): the count
    of a model litellm has no tokenizer for, scaled by what the provider reports."""
    return max(1, (len(orjson.dumps(messages)) + len(orjson.dumps(tools or []))) // 4)


@dataclass(frozen=True)
class ReportedPrompt:
    """A request whose prompt tokens the provider reported (the messages as sent)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tokens: int

    def is_prefix_of(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> bool:
        """Whether a request continues this one: same tools, these messages first."""
        n = len(self.messages)
        return self.tools == tools and len(messages) >= n and messages[:n] == self.messages


class ReportedPrompts:
    """The last two reported requests of each recent conversation (a conversation is named by
    its first two messages: the system prompt and the question), and the latest of all. A
    client serves many queries at once, so the previous request of the query being estimated
    is looked up by its conversation, not taken as the client's last."""

    CONVERSATIONS = 512

    def __init__(self) -> None:
        self._by_conversation: OrderedDict[bytes, tuple[ReportedPrompt, ...]] = OrderedDict()
        self.latest: ReportedPrompt | None = None

    @staticmethod
    def _conversation(messages: list[dict[str, Any]]) -> bytes:
        return hashlib.blake2b(orjson.dumps(messages[:2]), digest_size=16).digest()

    def note(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tokens: int
    ) -> None:
        reported = ReportedPrompt(list(messages), tools, tokens)
        key = self._conversation(messages)
        earlier = self._by_conversation.pop(key, ())
        self._by_conversation[key] = (*earlier[-1:], reported)
        while len(self._by_conversation) > self.CONVERSATIONS:
            self._by_conversation.popitem(last=False)
        self.latest = reported

    def history(self, messages: list[dict[str, Any]]) -> tuple[ReportedPrompt, ...]:
        """The conversation's reported requests, oldest first (at most two)."""
        return self._by_conversation.get(self._conversation(messages), ())


def estimate_prompt(
    litellm_model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    reported: ReportedPrompts,
) -> tuple[int, str]:
    """(prompt tokens, how they were counted) of a request the provider did not report.

    The local count is the model's tokenizer where litellm ships one (`count_prompt`), else
    characters / 4. A provider counts what no local tokenizer sees (how it renders tools and
    reasoning, its own system text), so its reported counts calibrate the local one: a request
    that continues the conversation's last reported one (the agent's next turn) is that count
    plus the part added since, scaled by the provider's tokens per local token over the
    conversation's previous step (or its whole last prompt); any other request is the local
    count scaled by the ratio of the latest reported request.
    """

    def local(msgs: list[dict[str, Any]], t: list[dict[str, Any]] | None) -> tuple[int, str]:
        counted = count_prompt(litellm_model, msgs, t)
        return counted if counted is not None else (character_estimate(msgs, t), "characters / 4")

    tokens, method = local(messages, tools)
    history = reported.history(messages)
    if history and history[-1].is_prefix_of(messages, tools):
        last = history[-1]
        before, _ = local(last.messages, last.tools)
        scale = last.tokens / max(1, before)
        if len(history) == 2 and history[0].is_prefix_of(last.messages, last.tools):
            earlier, _ = local(history[0].messages, history[0].tools)
            if before > earlier and last.tokens > history[0].tokens:
                scale = (last.tokens - history[0].tokens) / (before - earlier)
        added = round((tokens - before) * scale)
        return max(1, last.tokens + added), (
            f"{method}: the provider's count of the previous request ({last.tokens}) + "
            f"{added} added (x{scale:.3f}, the provider's tokens per counted one)"
        )
    latest = reported.latest
    if latest is None:
        return tokens, f"{method} (no call of this client reported usage yet)"
    ratio = latest.tokens / max(1, local(latest.messages, latest.tools)[0])
    return max(1, round(tokens * ratio)), (
        f"{method}: ratio {ratio:.3f} (the provider's last reported count / this count)"
    )
