"""The three tools of docs/spec.md §3 over one query's session.

A `ToolSession` belongs to one query: it caches that query's rankings (`s1`, `s2`, ...; at most
`cache_size`, oldest evicted first), keeps the full text of over-long outputs for the spill files,
tracks the document sets the metrics need, and can be blocked by the agent's time budget. Every
problem with a call, the model's or ours (a JVM or disk error), becomes an error observation the
agent can read and recover from, and ours is logged too; nothing raises out of `call`.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, Field

from piserini_ray.config import ToolsConfig
from piserini_ray.retrieval.searcher import Ranking
from piserini_ray.tools.excerpt import excerpt, query_tokens, token_pattern
from piserini_ray.tools.spill import spill_name, truncate, write_spill_file

TOOL_NAMES = ("search", "read_search_results", "read_document")
BLOCKED_MESSAGE = (
    "Tools are blocked: the time budget for this question is nearly spent. Do not call any "
    "more tools; give your final answer now from the evidence you already have."
)


class Backend(Protocol):
    """What the tools need from retrieval: rankings and document text, nothing of Lucene."""

    name: str  # which backend ranks (`retrieval.backend`), for the rankings log

    def search(self, text: str, k: int | None = None) -> Ranking: ...
    def docid(self, ordinal: int) -> str: ...
    def title(self, ordinal: int) -> str | None: ...
    def contents(self, ordinal: int) -> str: ...
    def ordinal(self, docid: str) -> int | None: ...


log = logging.getLogger(__name__)


def search_query(arguments: str | dict[str, Any] | None) -> str | None:
    """The query text of a `search` call's arguments, if they hold one (else None: the call
    itself reports what is wrong)."""
    try:
        query = _parse_arguments(arguments).get("query")
    except ToolArgumentError:
        return None
    return query if isinstance(query, str) and query.strip() else None


class ToolResult(BaseModel):
    """One tool call as the agent sees it and as the log records it."""

    tool: str
    ok: bool
    output: str
    error: str | None = None
    spill_file: str | None = None
    reason: str | None = None
    #: The documents the call showed (a page of hits) or opened (`read_document`).
    docids: list[str] = Field(default_factory=list)


class ToolArgumentError(ValueError):
    """A bad argument; the message is shown to the agent."""


@dataclass
class _CachedSearch:
    search_id: str
    query: str
    ranking: Ranking


class ToolSession:
    def __init__(
        self, backend: Backend, config: ToolsConfig = ToolsConfig(), spill_dir: Path | None = None
    ) -> None:
        self.backend = backend
        self.config = config
        self.spill_dir = spill_dir
        self._cache: OrderedDict[str, _CachedSearch] = OrderedDict()
        #: Every search of the session, evicted or not, for the run's rankings log.
        self.history: list[_CachedSearch] = []
        self._searches = 0
        #: Full texts of truncated outputs by spill file name: the run store writes them into
        #: the run directory with the query's record (a replica may sit on another node).
        self.spills: dict[str, str] = {}
        self.blocked = False
        #: The docids the current call shows (a page of hits) or opens (`ToolResult.docids`).
        self._shown: list[str] = []
        # Insertion-ordered sets of docids (dict keys) for the recall metrics.
        self.surfaced: dict[str, None] = {}
        self.previewed: dict[str, None] = {}
        self.opened: dict[str, None] = {}

    # ------------------------------------------------------------------ dispatch

    def block(self) -> None:
        """From now on every tool returns the blocked error (the agent's submit-now steer)."""
        self.blocked = True

    def call(self, name: str, arguments: str | dict[str, Any] | None) -> ToolResult:
        """Run one tool call; never raises for anything the model sent."""
        if name not in TOOL_NAMES:
            return self._error(
                name, f"Unknown tool {name!r}. The tools are: {', '.join(TOOL_NAMES)}."
            )
        try:
            args = _parse_arguments(arguments)
        except ToolArgumentError as e:
            return self._error(name, str(e))
        reason = _clip_words(args.get("reason"), self.config.reason_max_words)
        self._shown = []  # what this call shows or opens
        if self.blocked:
            return self._error(name, BLOCKED_MESSAGE, reason)
        try:
            output, spill = getattr(self, f"_{name}")(args)
        except ToolArgumentError as e:
            return self._error(name, str(e), reason)
        except Exception as e:  # ours, not the model's: the query goes on, the log says so
            log.warning("%s failed inside the tool: %s: %s", name, type(e).__name__, e)
            message = f"the {name} tool failed internally ({type(e).__name__}); try again."
            return self._error(name, message, reason)
        return ToolResult(
            tool=name, ok=True, output=output, spill_file=spill, reason=reason, docids=self._shown
        )

    def _error(self, tool: str, message: str, reason: str | None = None) -> ToolResult:
        return ToolResult(
            tool=tool, ok=False, output=f"Error: {message}", error=message, reason=reason
        )

    # ------------------------------------------------------------------ the tools

    def _search(self, args: dict[str, Any]) -> tuple[str, str | None]:
        _check_names(args, "search", required=("reason", "query"), optional=())
        _reason(args)
        query = _string(args, "query")
        ranking = self.backend.search(query)
        self._searches += 1
        search_id = f"s{self._searches}"
        self._cache[search_id] = _CachedSearch(search_id, query, ranking)
        self.history.append(self._cache[search_id])
        while len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)
        for ordinal in ranking.ordinals:
            self.surfaced.setdefault(self.backend.docid(int(ordinal)))
        if len(ranking) == 0:
            text = (
                f"Search {search_id} for {query!r}: no document matched. Try other words "
                "(searches are bags of words; stop words and punctuation are ignored)."
            )
            return text, None
        entry = self._cache[search_id]
        last = min(self.config.first_page, len(ranking))
        header = (
            f"Search {search_id} for {query!r}: {len(ranking)} hits cached. Showing ranks 1-{last}."
        )
        return self._page(entry, 1, last, header, "search")

    def _read_search_results(self, args: dict[str, Any]) -> tuple[str, str | None]:
        _check_names(
            args,
            "read_search_results",
            required=("reason", "search_id"),
            optional=("offset", "limit"),
        )
        _reason(args)
        search_id = _string(args, "search_id").strip()
        entry = self._cache.get(search_id)
        if entry is None:
            live = ", ".join(self._cache) or "none (run search first)"
            known = re.fullmatch(r"s(\d+)", search_id) and 0 < int(search_id[1:]) <= self._searches
            why = "was evicted from the cache" if known else "is unknown"
            raise ToolArgumentError(
                f"search_id {search_id!r} {why}. Live search ids: {live} "
                f"(the cache keeps the {self.config.cache_size} most recent searches)."
            )
        offset = _integer(args, "offset", self.config.browse_offset)
        limit = _integer(args, "limit", self.config.browse_limit, self.config.max_browse_limit)
        total = len(entry.ranking)
        if total == 0:
            raise ToolArgumentError(f"search {search_id} has no hits to browse.")
        if offset > total:
            raise ToolArgumentError(
                f"offset {offset} is past the end: search {search_id} has {total} hits "
                f"(valid offsets 1-{total})."
            )
        last = min(offset + limit - 1, total)
        header = f"Search {search_id} for {entry.query!r}: ranks {offset}-{last} of {total}."
        return self._page(entry, offset, last, header, "read_search_results")

    def _read_document(self, args: dict[str, Any]) -> tuple[str, str | None]:
        _check_names(
            args, "read_document", required=("reason", "docid"), optional=("offset", "limit")
        )
        _reason(args)
        docid = _string(args, "docid").strip()
        ordinal = self.backend.ordinal(docid)
        if ordinal is None:
            raise ToolArgumentError(
                f"unknown docid {docid!r}. Use a docid exactly as a search result shows it."
            )
        offset = _integer(args, "offset", self.config.doc_offset)
        limit = _integer(args, "limit", self.config.doc_limit, self.config.max_doc_limit)
        lines = self.backend.contents(ordinal).splitlines()
        total = len(lines)
        self._shown.append(docid)
        if total == 0:
            self.opened.setdefault(docid)
            return f"Document {docid} is empty.", None
        if offset > total:
            raise ToolArgumentError(
                f"offset {offset} is past the end: document {docid} has {total} lines "
                f"(valid offsets 1-{total})."
            )
        self.opened.setdefault(docid)
        last = min(offset + limit - 1, total)
        title = self.backend.title(ordinal)
        parts = [
            f"Document {docid}"
            + (f" ({title})" if title else "")
            + f": lines {offset}-{last} of {total}.",
            "",
            *lines[offset - 1 : last],
            "",
        ]
        if last < total:
            parts.append(
                f"More: read_document(docid={docid!r}, offset={last + 1}, limit={limit}) "
                f"continues ({total - last} lines remain)."
            )
        else:
            parts.append("[end of document]")
        return self._limit("\n".join(parts), "read_document", docid, f"lines-{offset}-{last}")

    # ------------------------------------------------------------------ layout

    def _page(
        self, entry: _CachedSearch, first: int, last: int, header: str, tool: str
    ) -> tuple[str, str | None]:
        pattern = token_pattern(query_tokens(entry.query))
        blocks = [header, ""]
        for rank in range(first, last + 1):
            ordinal = int(entry.ranking.ordinals[rank - 1])
            docid = self.backend.docid(ordinal)
            self.previewed.setdefault(docid)
            self._shown.append(docid)
            blocks.append(self._hit(rank, ordinal, docid, entry.ranking.scores[rank - 1], pattern))
        total = len(entry.ranking)
        if last < total:
            blocks.append(
                f"More: read_search_results(search_id={entry.search_id!r}, offset={last + 1}, "
                f"limit={self.config.browse_limit}) shows the next hits ({total - last} remain)."
            )
        else:
            blocks.append(f"[end of search {entry.search_id}: all {total} hits shown]")
        return self._limit("\n".join(blocks), tool, entry.search_id, f"ranks-{first}-{last}")

    def _hit(self, rank: int, ordinal: int, docid: str, score: float, pattern: Any) -> str:
        lines = [f"[{rank}] docid: {docid} | score: {score:.4f}"]
        title = self.backend.title(ordinal)
        if title:
            lines.append(f"    title: {title}")
        if rank <= self.config.excerpt_ranks:
            text = self.backend.contents(ordinal)
            if title and text.startswith(title + "\n"):
                text = text[len(title) + 1 :]  # the title is shown above
            lines.append(
                "    excerpt: "
                + excerpt(text, pattern, self.config.excerpt_chars, self.config.excerpt_lead)
            )
        else:
            lines.append(
                f"    (no excerpt below rank {self.config.excerpt_ranks}; open with read_document)"
            )
        return "\n".join(lines) + "\n"

    def _limit(self, text: str, tool: str, subject: str, span: str) -> tuple[str, str | None]:
        """Truncate an over-long output for the agent and spill the full text to a file."""
        shown, cut = truncate(text, self.config.spill_max_lines, self.config.spill_max_bytes)
        if not cut:
            return text, None
        spill = spill_name(len(self.spills) + 1, tool, subject, span)
        self.spills[spill] = text
        if self.spill_dir is not None:  # a command-line session writes its own
            write_spill_file(self.spill_dir, spill, text)
        note = f"the full output is in spill file {spill}"
        shown += (
            f"\n[output truncated to {self.config.spill_max_lines} lines / "
            f"{self.config.spill_max_bytes} bytes; {note}. Ask for a smaller range (limit).]"
        )
        return shown, spill


# ---------------------------------------------------------------------- argument checking


def _clip_words(reason: object, max_words: int) -> str | None:
    """The reason as recorded in the log: at most `max_words` words."""
    if not isinstance(reason, str):
        return None
    words = reason.split()
    return reason if len(words) <= max_words else " ".join(words[:max_words]) + " …"


def _parse_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise ToolArgumentError(
            f"the arguments are not valid JSON: {arguments[:200]!r}. Send a JSON object."
        ) from None
    if not isinstance(parsed, dict):
        raise ToolArgumentError(
            f"the arguments must be a JSON object, not {type(parsed).__name__}."
        )
    return parsed


def _check_names(
    args: dict[str, Any], tool: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    missing = [name for name in required if name not in args]
    unknown = [name for name in args if name not in required + optional]
    if missing or unknown:
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown argument(s) {', '.join(unknown)}")
        accepted = ", ".join([*required, *(f"{o} (optional)" for o in optional)])
        raise ToolArgumentError(f"{tool}: {'; '.join(problems)}. It takes: {accepted}.")


def _string(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ToolArgumentError(f"{name} must be a string, got {type(value).__name__}.")
    return value


def _reason(args: dict[str, Any]) -> None:
    if not _string(args, "reason").strip():
        raise ToolArgumentError("reason must be a short rationale (at most 100 words), not empty.")


def _integer(args: dict[str, Any], name: str, default: int, maximum: int | None = None) -> int:
    value = args.get(name, default)
    if value is None:
        value = default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolArgumentError(f"{name} must be an integer, got {value!r}.")
    if value < 1:
        raise ToolArgumentError(f"{name} must be at least 1, got {value}.")
    if maximum is not None and value > maximum:
        raise ToolArgumentError(f"{name} must be at most {maximum}, got {value}.")
    return value
