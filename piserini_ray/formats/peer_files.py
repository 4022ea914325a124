"""The peers' run files as their own readers find and parse them.

- BrowseComp-Plus: one JSON object per query (`run_<time>.json`, as their `search_agent`
  clients write them, or our export), or one object per line (`*.jsonl`, as their
  `download_and_decrypt_run.py` writes the published runs). A file whose `query_id` is null
  (their single-query mode) is skipped, as their `evaluate_run.py` skips it.
- Pi-Serini: `<query id>.json` per query (`run_pi_benchmark.ts`); a sharded run's `merged/`
  folder when it holds any run file, whatever its names (as their `evaluate_run_with_pi`'s
  `resolveBenchmarkResultDir`; their `summarize_run` would look for all-digit names only).

A file that is not JSON, or whose fields are malformed, stops the import with a message naming
the file, the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from piserini_ray.errors import DataError
from piserini_ray.records import Usage

Format = Literal["browsecomp-plus", "pi-serini"]
FORMATS: tuple[Format, ...] = get_args(Format)

#: Files of a run folder that are not run files: Pi-Serini's (their `evaluate_run_with_pi.ts`
#: leaves out the same names) and the leaderboard summary our BrowseComp-Plus export writes.
PI_SERINI_RESERVED = {
    "benchmark_manifest_snapshot.json",
    "evaluation_summary.json",
    "run_setup.json",
}
BROWSECOMP_PLUS_RESERVED = {"evaluation_summary.json"}

#: What each field of a run file holds, for the message when it is missing or malformed.
HINTS = {
    "query_id": "the query's id in the benchmark",
    "status": "completed, timeout or failed",
    "result": "a list of items, the last one the output_text answer",
    "retrieved_docids": "the list of docids the retriever returned",
    "surfaced_docids": "the list of docids the searches surfaced",
    "tool_call_counts": "an object: tool name -> number of calls",
    "usage": "an object with input_tokens and output_tokens",
    "metadata": "an object",
    "stats": "an object",
}


def _as_text(value: Any) -> Any:
    """Ids as the harnesses write them: strings, or numbers (taken as their text)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


Id = Annotated[str, BeforeValidator(_as_text)]


class ResultItem(BaseModel):
    """One item of a run file's `result` list: a tool call, reasoning, or the output text."""

    model_config = ConfigDict(extra="allow")

    type: str
    tool_name: str | None = None
    arguments: Any = None
    output: Any = None


class RunMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    #: Our extension (`formats/peer_writers.py: browsecomp_plus_run`): the record's document sets,
    #: which `retrieved_docids` alone cannot carry.
    document_sets: dict[str, list[Id]] | None = None


class RunFile(BaseModel):
    """What both formats share: one query's run."""

    model_config = ConfigDict(extra="ignore")

    query_id: Id = Field(min_length=1)
    status: str
    result: list[ResultItem]
    tool_call_counts: dict[str, int] = Field(default_factory=dict)
    metadata: RunMetadata = Field(default_factory=RunMetadata)


class BrowseCompPlusUsage(BaseModel):
    """Their `usage` block as written; what it means depends on the client that wrote it
    (`formats/peer_usage.py`). A count they could not get is null."""

    model_config = ConfigDict(extra="ignore")

    input_tokens: int | None = None
    input_tokens_cached: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    included_reasoning_tokens: int | None = None
    #: Our export's extension: cache writes apart from reads.
    cache_write_tokens: int | None = None


class BrowseCompPlusRun(RunFile):
    #: None when the file has none: their evaluator then counts no document retrieved.
    retrieved_docids: list[Id] | None = None
    usage: BrowseCompPlusUsage | None = None


class PiSeriniStats(BaseModel):
    model_config = ConfigDict(extra="ignore")

    elapsed_seconds: float | None = None
    assistant_turns: int | None = None


class PiSeriniRun(RunFile):
    """A run file of `run_pi_benchmark.ts` (or of our `export --format pi-serini`): the docid
    tiers under their names; `retrieved_docids` is their readers' fallback for surfaced."""

    surfaced_docids: list[Id] | None = None
    retrieved_docids: list[Id] | None = None
    previewed_docids: list[Id] | None = None
    opened_docids: list[Id] | None = None
    cited_docids: list[Id] | None = None
    agent_docids: list[Id] | None = None
    stats: PiSeriniStats = Field(default_factory=PiSeriniStats)
    #: Our export's extension (their harness reports no usage).
    usage: Usage | None = None


Run = BrowseCompPlusRun | PiSeriniRun


@dataclass
class Source:
    """One run: its file, and its line when the file holds one run per line."""

    path: Path
    line: int | None
    data: Any

    @property
    def name(self) -> str:
        return self.path.name if self.line is None else f"{self.path.name}:{self.line}"


@dataclass
class Found:
    """The folder the runs came from, the runs, how many files were read, and the runs
    skipped (name, reason)."""

    folder: Path
    sources: list[Source]
    files: int
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _is_run_folder(folder: Path, reserved: set[str]) -> bool:
    return any(p.is_file() and p.name not in reserved for p in folder.glob("*.json"))


def _parse(path: Path) -> list[Source]:
    """A file's runs: one JSON object, or one per line (`*.jsonl`, or a `.json` holding
    lines)."""
    raw = path.read_bytes()
    if path.suffix != ".jsonl":
        try:
            return [Source(path, None, orjson.loads(raw))]
        except orjson.JSONDecodeError as e:
            lines = [x for x in raw.splitlines() if x.strip()]
            if len(lines) < 2:
                raise DataError(
                    f"run file {path}",
                    f"not valid JSON ({e}); fix the file or move it out of {path.parent} "
                    "(nothing was imported)",
                ) from None
    sources = []
    for n, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            sources.append(Source(path, n, orjson.loads(line)))
        except orjson.JSONDecodeError as e:
            raise DataError(
                f"run file {path}, line {n}",
                f"not valid JSON ({e}); one run per line is expected (nothing was imported)",
            ) from None
    return sources


def find_runs(path: Path, fmt: Format, log: Any) -> Found:
    """Every run of `path` (a folder, or one `.json`/`.jsonl` file)."""
    path = Path(path)
    reserved = PI_SERINI_RESERVED if fmt == "pi-serini" else BROWSECOMP_PLUS_RESERVED
    if path.is_file():
        folder, files = path.parent, [path]
    elif path.is_dir():
        folder = path
        merged = path / "merged"
        if fmt == "pi-serini" and merged.is_dir() and _is_run_folder(merged, reserved):
            log(f"{path} is a sharded Pi-Serini run: reading its merged/ folder")
            folder = merged
        # One run per line is BrowseComp-Plus's published format; a Pi-Serini folder's
        # `.jsonl` files are its raw events or our export's ground truth.
        lines = [*folder.glob("*.jsonl")] if fmt == "browsecomp-plus" else []
        files = sorted(
            p for p in [*folder.glob("*.json"), *lines] if p.is_file() and p.name not in reserved
        )
    else:
        raise DataError(path, f"not a folder of {fmt} run files, nor a run file")
    if not files:
        raise DataError(
            folder,
            f"holds no run file of the {fmt} format (*.json one query each, or *.jsonl one "
            "query per line)",
        )
    sources = [s for f in files for s in _parse(f)]
    return Found(folder=folder, sources=sources, files=len(files))


def _field(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _problem(error: ValidationError) -> str:
    """A run file's first problem: the field, what is wrong, what it should hold."""
    first = error.errors()[0]
    loc = tuple(first["loc"])
    hint = HINTS.get(str(loc[0]), "") if loc else ""
    what = "is missing" if first["type"] == "missing" else f"is malformed: {first['msg']}"
    more = len(error.errors()) - 1
    return (
        f"field '{_field(loc)}' {what}"
        + (f" ({hint})" if hint else "")
        + (f"; {more} more problem(s) in this file" if more else "")
    )


def load_run(source: Source, fmt: Format) -> Run | str:
    """One run, validated; a reason (str) when it is skipped as their evaluator skips it; a
    DataError naming the file, the field and the fix when it is malformed."""
    where = f"run file {source.path}" + (f", line {source.line}" if source.line else "")
    fix = f"; fix the file or move it out of {source.path.parent} (nothing was imported)"
    data = source.data
    if not isinstance(data, dict):
        raise DataError(where, f"not a JSON object (one query's {fmt} run){fix}")
    if "query_id" in data and data["query_id"] is None:
        return "query_id is null (their single-query mode): skipped, as their evaluator does"
    model = BrowseCompPlusRun if fmt == "browsecomp-plus" else PiSeriniRun
    try:
        run = model.model_validate(data)
    except ValidationError as e:
        raise DataError(where, _problem(e) + fix) from None
    if (
        isinstance(run, PiSeriniRun)
        and run.surfaced_docids is None
        and run.retrieved_docids is None
    ):
        hint = HINTS["surfaced_docids"]
        raise DataError(where, f"field 'surfaced_docids' is missing ({hint}){fix}")
    return run


def final_text(run: RunFile) -> str | None:
    """The final answer: the last `result` item when it is output text (their readers take
    only that one); None otherwise."""
    last = run.result[-1] if run.result else None
    if last is not None and last.type == "output_text" and isinstance(last.output, str):
        return last.output
    return None


def read_json(path: Path) -> dict[str, Any]:
    """A settings file of a run (Pi-Serini's `run_setup.json`, manifest snapshot); {} when it
    is absent or not an object."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
