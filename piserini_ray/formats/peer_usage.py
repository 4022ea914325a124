"""A BrowseComp-Plus `usage` block by what the client that wrote it means.

- Their OpenAI clients (and our export): `input_tokens` is every input token, cached ones
  included; `input_tokens_cached` the cached part (OpenAI's `cached_tokens`).
- Their Anthropic client (`anthropic_client.py: _persist_response`): `input_tokens` is
  Anthropic's uncached input only, and `input_tokens_cached` = `cache_creation_input_tokens` +
  `cache_read_input_tokens`, a sum (null when both are 0). Writes bill above the input price
  and reads far below it, and the file cannot tell them apart: the record takes them all as
  reads (the lower bound of the cost) and the import prices them as writes too (the upper).
"""

from __future__ import annotations

from dataclasses import dataclass

from piserini_ray.formats.peer_files import BrowseCompPlusRun
from piserini_ray.records import Usage


def anthropic_shape(run: BrowseCompPlusRun) -> bool:
    """Written by their Anthropic client: its metadata's `pause_restarts` (no other client
    writes it) or a Claude model, and not our own export."""
    extra = run.metadata.model_extra or {}
    if extra.get("framework") == "piserini_ray":
        return False
    model = (run.metadata.model or "").lower()
    return "pause_restarts" in extra or model.split("/")[-1].startswith("claude")


@dataclass
class Mapped:
    #: Our usage (None: the file has no input or output count); cache tokens as reads.
    usage: Usage | None
    #: Cached tokens whose split into cache writes and reads the file does not give.
    unsplit_cache: int = 0

    def as_writes(self) -> Usage | None:
        """The same usage with the unsplit cached tokens taken as writes (the upper bound)."""
        if self.usage is None or not self.unsplit_cache:
            return self.usage
        return self.usage.model_copy(
            update={
                "cached_tokens": self.usage.cached_tokens - self.unsplit_cache,
                "cache_write_tokens": self.usage.cache_write_tokens + self.unsplit_cache,
            }
        )


def browsecomp_plus_usage(run: BrowseCompPlusRun) -> Mapped:
    u = run.usage
    if u is None or u.input_tokens is None or u.output_tokens is None:
        return Mapped(None)
    reasoning = u.reasoning_tokens or u.included_reasoning_tokens or 0
    cached = u.input_tokens_cached or 0
    if anthropic_shape(run):
        usage = Usage(
            input_tokens=u.input_tokens + cached,
            output_tokens=u.output_tokens,
            cached_tokens=cached,
            reasoning_tokens=reasoning,
        )
        return Mapped(usage, unsplit_cache=cached)
    return Mapped(
        Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cached_tokens=cached,
            cache_write_tokens=u.cache_write_tokens or 0,
            reasoning_tokens=reasoning,
        )
    )
