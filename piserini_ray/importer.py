"""`piserini-ray import`: runs made by other harnesses as a run directory over a config's
benchmark, so that `judge`, `report`, `compare` and `export` read them as our own runs. The
inverse of `report/export.py`, for BrowseComp-Plus run files (one JSON per query, as their
`search_agent/*_client.py` write them) and Pi-Serini run folders (`run_pi_benchmark.ts`).

Every file is read and checked before anything is written: a bad file stops the import with a
message naming the file, the field and the fix, and no record is written. A format holds less
than our records: what it lacks is listed in each record (`QueryRecord.imported`), and the
report shows every figure that depends on it as n/a, never as 0. Importing into the same run
directory again skips the queries it holds already.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from piserini_ray.agent.answer import parse_final_answer
from piserini_ray.config import RunConfig
from piserini_ray.data import Benchmark, load_benchmark
from piserini_ray.errors import ConfigError, DataError
from piserini_ray.metrics.recall import DOC_SETS
from piserini_ray.records import (
    UNAVAILABLE,
    ImportedFrom,
    QueryRecord,
    Status,
    Unavailable,
    Usage,
)
from piserini_ray.report.export import PI_SERINI_TIERS
from piserini_ray.store import RunStore

Format = Literal["browsecomp-plus", "pi-serini"]
FORMATS: tuple[Format, ...] = get_args(Format)
Log = Callable[[str], None]

#: What each part a format may lack takes out of the report, in words (the command prints it).
MEANING: dict[Unavailable, str] = {
    "usage": "tokens and cost",
    "previewed": "previewed recall",
    "opened": "opened recall",
    "behavior": "behavior recall",
    "trajectory": "turns and the per-query trajectory",
    "rankings": "the depth curve",
    "timing": "the budget analysis (charged seconds)",
    "wall": "wall-clock seconds",
}
assert set(MEANING) == set(UNAVAILABLE)

#: Files of a Pi-Serini run folder that are not run files (their `evaluate_run_with_pi.ts`
#: leaves out the same names).
PI_SERINI_RESERVED = {
    "benchmark_manifest_snapshot.json",
    "evaluation_summary.json",
    "run_setup.json",
}

#: What each field of a run file holds, for the message when it is missing or malformed.
_HINTS = {
    "query_id": "the query's id in the benchmark",
    "status": "completed, timeout or failed",
    "result": "a list of items ending with an output_text item",
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
    #: Our extension (`report/export.py: browsecomp_plus_run`): the record's document sets,
    #: which `retrieved_docids` alone cannot carry.
    document_sets: dict[str, list[Id]] | None = None


class RunFile(BaseModel):
    """What both formats share: one query's run."""

    model_config = ConfigDict(extra="ignore")

    query_id: Id = Field(min_length=1)
    status: str
    result: list[ResultItem]
    tool_call_counts: dict[str, int]
    metadata: RunMetadata = Field(default_factory=RunMetadata)


class BrowseCompPlusUsage(BaseModel):
    """Their `usage` block (`included_reasoning_tokens` in their harness, `reasoning_tokens`
    in our export); a count they could not get is null."""

    model_config = ConfigDict(extra="ignore")

    input_tokens: int | None = None
    input_tokens_cached: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    included_reasoning_tokens: int | None = None

    def ours(self) -> Usage | None:
        """Our usage, or None when the input or output count is unknown."""
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_tokens=self.input_tokens_cached or 0,
            reasoning_tokens=self.reasoning_tokens or self.included_reasoning_tokens or 0,
        )


class BrowseCompPlusRun(RunFile):
    retrieved_docids: list[Id]
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


class ImportSummary(BaseModel):
    """What an import did, for the command to print."""

    run_dir: str
    format: Format
    source: str
    imported: int
    #: Queries the run directory held already: not imported twice.
    skipped: int
    #: Queries of the config's slice with no run file in the folder.
    without_file: int
    statuses: dict[str, int]
    #: The parts the imported records lack (`records.UNAVAILABLE`), in that order.
    unavailable: list[Unavailable]


@dataclass
class _Docids:
    """The corpus's docids, read once and only when an answer's citations must be checked
    (our agent keeps a cited docid only if it exists): from the index when it was built, else
    from the corpus itself."""

    config: RunConfig
    benchmark: Benchmark
    log: Log
    known: set[str] | None = None

    def exists(self, docid: str) -> bool:
        if self.known is None:
            from piserini_ray.retrieval.docstore import read_docids
            from piserini_ray.retrieval.index import find_index

            root = self.config.retrieval.resolved_index_root()
            index = find_index(self.benchmark.corpus, root)
            if index is None:
                self.log(f"no index of the corpus under {root}: reading the corpus's docids")
                self.known = {d.docid for d in self.benchmark.corpus}
            else:
                self.known = set(read_docids(index))
        return docid in self.known


def default_run_dir(config: RunConfig, fmt: Format, folder: Path) -> Path:
    """`<runs root>/imported-<format>-<folder name>`."""
    name = Path(folder).absolute().name or "runs"
    return config.runtime.resolved_runs_root() / f"imported-{fmt}-{name}"


def run_files(folder: Path, fmt: Format, log: Log) -> tuple[Path, list[Path]]:
    """The folder that holds the run files, and the files: every `*.json` (their evaluators
    read them all); of a Pi-Serini folder, without its manifest snapshot and summaries, and
    from `merged/` when a sharded run has one (as their `resolveBenchmarkResultDir`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(folder, f"not a folder of {fmt} run files")
    if fmt == "pi-serini":
        merged = folder / "merged"
        if merged.is_dir() and any(p.name[:-5].isdigit() for p in merged.glob("*.json")):
            log(f"{folder} is a sharded Pi-Serini run: reading its merged/ folder")
            folder = merged
    files = sorted(
        p
        for p in folder.glob("*.json")
        if p.is_file() and not (fmt == "pi-serini" and p.name in PI_SERINI_RESERVED)
    )
    if not files:
        raise DataError(folder, f"holds no run file (*.json, one per query) of the {fmt} format")
    return folder, files


def _field(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _problem(error: ValidationError) -> str:
    """A run file's first problem: the field, what is wrong, what it should hold."""
    first = error.errors()[0]
    loc = tuple(first["loc"])
    hint = _HINTS.get(str(loc[0]), "") if loc else ""
    what = "is missing" if first["type"] == "missing" else f"is malformed: {first['msg']}"
    more = len(error.errors()) - 1
    return (
        f"field '{_field(loc)}' {what}"
        + (f" ({hint})" if hint else "")
        + (f"; {more} more problem(s) in this file" if more else "")
    )


def _load(path: Path, fmt: Format) -> BrowseCompPlusRun | PiSeriniRun:
    """One run file, validated; a DataError naming the file, the field and the fix."""
    where = f"run file {path}"
    fix = f"; fix the file or move it out of {path.parent} (nothing was imported)"
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise DataError(where, f"not valid JSON ({e}){fix}") from None
    if not isinstance(data, dict):
        raise DataError(where, f"not a JSON object (one query's {fmt} run){fix}")
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
        hint = _HINTS["surfaced_docids"]
        raise DataError(where, f"field 'surfaced_docids' is missing ({hint}){fix}")
    if run.status == "completed" and _final(run) is None:
        raise DataError(
            where,
            "field 'result' does not end with an output_text item, though the status is "
            f"'completed' ({_HINTS['result']}: the final answer){fix}",
        )
    return run


def _final(run: RunFile) -> str | None:
    """The final answer: the last `result` item when it is output text (their readers take
    only that one)."""
    last = run.result[-1] if run.result else None
    if last is not None and last.type == "output_text" and isinstance(last.output, str):
        return last.output
    return None


def _mtime(path: Path) -> str:
    stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return stamp.isoformat(timespec="milliseconds")


#: The sets a format may lack (surfaced and cited every import has: the latter from the answer).
_OPTIONAL_SETS: tuple[Unavailable, ...] = ("previewed", "opened", "behavior")
_STATUSES: dict[str, Status] = {s: s for s in get_args(Status)}


def _sets(
    run: BrowseCompPlusRun | PiSeriniRun, cited: Callable[[], list[str]]
) -> tuple[dict[str, list[str]], list[Unavailable]]:
    """The record's document sets from what the file holds, and the sets it lacks. `cited`:
    the citations parsed from the answer, for a file that does not list them."""
    if isinstance(run, BrowseCompPlusRun):
        # Our own export keeps all five sets; theirs has only what the retriever returned.
        held = dict(run.metadata.document_sets or {})
        held.setdefault("surfaced", run.retrieved_docids)
    else:
        tiers = {name: getattr(run, field) for name, field in PI_SERINI_TIERS.items()}
        held = {name: docs for name, docs in tiers.items() if docs is not None}
        held.setdefault("surfaced", run.retrieved_docids or [])
    if "cited" not in held:
        held["cited"] = cited()
    if "behavior" not in held and "opened" in held:  # opened ∪ cited, as the agent's
        held["behavior"] = list(dict.fromkeys(held["opened"] + held["cited"]))
    lacking = [name for name in _OPTIONAL_SETS if name not in held]
    sets = {name: list(dict.fromkeys(held.get(name, []))) for name in DOC_SETS}
    return sets, lacking


def to_record(
    run: BrowseCompPlusRun | PiSeriniRun,
    path: Path,
    fmt: Format,
    config: RunConfig,
    docids: Callable[[str], bool],
) -> QueryRecord:
    """Our record of one query's run file (its run id and config hash are the store's, set
    when it is written). A status other than completed, timeout or failed is a failure with
    that status as its error; only a completed query keeps its answer and citations (as
    `agent/loop.py: build_record`)."""
    status = _STATUSES.get(run.status, "failed")
    error = None if status == run.status else run.status
    final = _final(run)
    if isinstance(run, PiSeriniRun) and final is not None and final.startswith("pi stderr:"):
        error, final = final, None  # their harness appends the agent's stderr when it failed
    completed = status == "completed"
    # Every bracketed candidate first; the corpus is read only for a file that does not list
    # its citations (then, as the agent's, only docids of the corpus count).
    parsed = parse_final_answer(final)
    sets, lacking = _sets(run, lambda: [d for d in parsed.cited if docids(d)] if completed else [])
    unavailable: list[Unavailable] = [*lacking, "trajectory", "rankings", "timing"]
    usage: Usage | None
    if isinstance(run, BrowseCompPlusRun):
        usage = run.usage.ours() if run.usage is not None else None
        wall, turns = None, None
    else:
        usage = run.usage
        wall, turns = run.stats.elapsed_seconds, run.stats.assistant_turns
    if usage is None:
        unavailable.append("usage")
    if wall is None:
        unavailable.append("wall")
    stamp = _mtime(path)
    return QueryRecord(
        run_id="",
        config_hash="",
        query_id=run.query_id,
        model=run.metadata.model or config.model.name,
        status=status,
        error=error,
        final_answer=final if completed else None,
        explanation=parsed.explanation,
        exact_answer=parsed.exact_answer if completed else None,
        confidence=parsed.confidence,
        confidence_missing=parsed.confidence_missing,
        cited=sets["cited"],
        turns=turns,
        tool_call_counts=run.tool_call_counts,
        usage=usage or Usage(),
        wall_seconds=wall or 0.0,
        surfaced=sets["surfaced"],
        previewed=sets["previewed"],
        opened=sets["opened"],
        behavior=sets["behavior"],
        started_at=stamp,
        finished_at=stamp,
        imported=ImportedFrom(
            format=fmt,
            directory=str(path.parent.absolute()),
            file=path.name,
            unavailable=[u for u in UNAVAILABLE if u in unavailable],
        ),
    )


def _files_tsv(folder: Path) -> dict[str, str]:
    """Our Pi-Serini export's `files.tsv` (file -> query id), when the folder has one."""
    path = folder / "files.tsv"
    if not path.is_file():
        return {}
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    return {row[0]: row[1] for row in rows if len(row) >= 2}


def read_runs(
    folder: Path, fmt: Format, config: RunConfig, benchmark: Benchmark, log: Log
) -> list[QueryRecord]:
    """Every run file of `folder` as a record, in the benchmark's order, each checked first:
    its fields, its query (a query of the config's slice, once in the folder). Nothing is
    written here: a bad file stops the import before any record is."""
    folder, files = run_files(folder, fmt, log)
    wanted = {q.query_id for q in benchmark.select(**config.slice.model_dump())}
    known = {q.query_id for q in benchmark.queries}
    named = _files_tsv(folder) if fmt == "pi-serini" else {}
    docids = _Docids(config, benchmark, log)
    seen: dict[str, Path] = {}
    records = []
    for path in files:
        run = _load(path, fmt)
        where = f"run file {path}"
        qid = run.query_id
        if named.get(path.name, qid) != qid:
            raise DataError(
                where,
                f"its query_id is {qid!r} but files.tsv names {named[path.name]!r} for it; "
                "correct one of them",
            )
        if qid not in known:
            raise DataError(
                where,
                f"query_id {qid!r} is not a query of benchmark {benchmark.name!r}; import with "
                "the config of the benchmark the run was made on (--config)",
            )
        if qid not in wanted:
            raise DataError(
                where,
                f"query_id {qid!r} is not in the config's slice ({config.slice.model_dump()}), "
                "so judge and report would leave it out; import with a config whose slice "
                "holds it (no slice: every query), or move the file out",
            )
        if qid in seen:
            raise DataError(
                where,
                f"query_id {qid!r} is also the query of {seen[qid]}; keep one run file per query",
            )
        seen[qid] = path
        records.append(to_record(run, path, fmt, config, docids.exists))
    order = {q.query_id: i for i, q in enumerate(benchmark.queries)}
    return sorted(records, key=lambda r: order[r.query_id])


def import_runs(
    folder: Path,
    fmt: Format,
    config: RunConfig,
    run_dir: Path | None = None,
    log: Log = lambda _m: None,
) -> ImportSummary:
    """Import a folder of run files into `run_dir` (default: `default_run_dir`), over the
    config's benchmark; queries the run directory holds already are skipped."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if config.run.epochs > 1:
        raise ConfigError(
            "an import is one epoch of a run: set run.epochs to 1 in the config (import each "
            "epoch's folder into a run directory of its own)"
        )
    benchmark = load_benchmark(config.benchmark)
    wanted = benchmark.select(**config.slice.model_dump())
    records = read_runs(folder, fmt, config, benchmark, log)
    run_dir = run_dir or default_run_dir(config, fmt, folder)
    with RunStore(run_dir, config, log=log) as store:
        done = store.done()
        new = [r for r in records if r.query_id not in done]
        for record in new:
            store.append(
                record.model_copy(update={"run_id": store.run_id, "config_hash": store.config_hash})
            )
        directory = store.run_dir
    skipped = len(records) - len(new)
    if skipped:
        log(
            f"{skipped} of the {len(records)} queries of {folder} already have a record in "
            f"{directory}: skipped, not imported twice"
        )
    lacking = {u for r in new for u in (r.imported.unavailable if r.imported else [])}
    files = {r.query_id for r in records}
    return ImportSummary(
        run_dir=str(directory),
        format=fmt,
        source=str(Path(folder).absolute()),
        imported=len(new),
        skipped=skipped,
        without_file=sum(1 for q in wanted if q.query_id not in files),
        statuses=dict(Counter(r.status for r in new)),
        unavailable=[u for u in UNAVAILABLE if u in lacking],
    )
