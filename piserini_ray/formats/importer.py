"""`piserini-ray import`: runs made by other harnesses as a run directory over a config's
benchmark, so that `judge`, `report`, `compare` and `export` read them as our own runs. The
inverse of `formats/peer_writers.py`, for BrowseComp-Plus run files (one JSON per query as their
`search_agent/*_client.py` write them, or one per line as their published runs) and Pi-Serini
run folders (`run_pi_benchmark.ts`), read with their evaluators' semantics
(`formats/peer_files.py`).

- A file whose status is `completed` but whose last `result` item is not `output_text` (their
  clients write such files at `--max-iterations`, for an empty final message, for a Qwen final
  message that carries only reasoning) is a completed query with an empty answer: wrong, as
  their `evaluate_run.py` scores it. A `query_id: null` file, or a query the benchmark does
  not hold, is skipped, as their evaluator skips it. Each is named in the summary.
- No docid outside the corpus enters a document set: those a file lists are dropped and
  counted. A Pi-Serini file's `cited_docids` hold only the digit runs of bracketed citations
  (their writer's parser), so non-numeric docids become fragments: when the list does not
  resolve in the corpus, the citations are parsed again from the answer text with ours.
- Usage by its meaning (`formats/peer_usage.py`); the run is priced with the files' model through
  the pricing table, never the config's; the run's config takes the files' model, and
  `imported.json` (`formats/imported.py`) what the files state about the retriever and settings.

A malformed file stops the import before anything is written, with a message naming the file,
the field and the fix. A format holds less than our records: what it lacks is listed in each
record (`QueryRecord.imported`) and the report shows every figure that depends on it as n/a,
never as 0. Importing into the same run directory again skips the queries it holds already.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

from pydantic import BaseModel

from piserini_ray.agent.answer import parse_final_answer
from piserini_ray.config import BM25Params, RunConfig
from piserini_ray.data import Benchmark, load_benchmark
from piserini_ray.errors import ConfigError, DataError
from piserini_ray.formats.imported import (
    CostNote,
    ImportedRun,
    SkippedFile,
    settings_text,
    write_imported,
)
from piserini_ray.formats.peer_files import (
    FORMATS,
    BrowseCompPlusRun,
    Format,
    PiSeriniRun,
    Run,
    Source,
    final_text,
    find_runs,
    load_run,
)
from piserini_ray.formats.peer_settings import Stated, stated
from piserini_ray.formats.peer_usage import Mapped, browsecomp_plus_usage
from piserini_ray.formats.peer_writers import PI_SERINI_TIERS
from piserini_ray.metrics.recall import DOC_SETS
from piserini_ray.records import (
    UNAVAILABLE,
    ImportedFrom,
    QueryRecord,
    Status,
    Unavailable,
    Usage,
)
from piserini_ray.store import RunStore

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


class ImportSummary(BaseModel):
    """What an import did, for the command to print."""

    run_dir: str
    format: Format
    source: str
    #: Files read (a JSONL file is one file of many runs), runs imported.
    files_read: int = 0
    imported: int
    #: Queries the run directory held already: not imported twice.
    skipped: int
    #: Runs skipped as the peer's evaluator skips them, each with its file and reason.
    skipped_files: list[SkippedFile] = []
    #: Queries of the config's slice with no run file in the folder.
    without_file: int
    statuses: dict[str, int]
    #: The parts the imported records lack (`records.UNAVAILABLE`), in that order.
    unavailable: list[Unavailable]
    #: What the import changed or could not tell, one line each (also in `imported.json`).
    notes: list[str] = []
    #: The model, retriever and settings as the files state them.
    settings: str = ""
    cost: str = ""


@dataclass
class _Corpus:
    """The corpus's docids, read once: from the index when it was built, else from the corpus
    itself."""

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


@dataclass
class _Tally:
    """What the import changed, across files: for the notes."""

    empty: list[str] = field(default_factory=list)
    rederived: list[str] = field(default_factory=list)
    #: set -> (docids dropped, files)
    dropped: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    unsplit_cache: list[str] = field(default_factory=list)
    no_retrieved: list[str] = field(default_factory=list)

    def drop(self, name: str, count: int, file: str) -> None:
        if count:
            n, files = self.dropped.get(name, (0, []))
            self.dropped[name] = (n + count, [*files, file])

    def notes(self) -> list[str]:
        def some(files: list[str]) -> str:
            return ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")

        notes = []
        if self.empty:
            notes.append(
                f"{len(self.empty)} completed run(s) whose last result item is not output_text "
                "(max iterations, an empty or reasoning-only final message) scored as an empty "
                f"answer, as their evaluator does: {some(self.empty)}"
            )
        for name, (n, files) in sorted(self.dropped.items()):
            notes.append(
                f"{n} {name} docid(s) not in the corpus dropped from {len(files)} run(s): "
                f"{some(files)}"
            )
        if self.rederived:
            notes.append(
                f"cited_docids of {len(self.rederived)} run(s) did not resolve in the corpus "
                "(Pi-Serini's writer keeps only the digit runs of bracketed citations): "
                f"citations parsed again from the answer text: {some(self.rederived)}"
            )
        if self.no_retrieved:
            notes.append(
                f"{len(self.no_retrieved)} run(s) without retrieved_docids: nothing surfaced for "
                f"them (recall 0), as their evaluator counts it: {some(self.no_retrieved)}"
            )
        if self.unsplit_cache:
            notes.append(
                f"usage of {len(self.unsplit_cache)} run(s) written by BrowseComp-Plus's "
                "Anthropic client: input_tokens is uncached input and input_tokens_cached sums "
                "cache writes and cache reads, which the file cannot tell apart; the cost is a "
                "bound (records take them as reads, the lower bound)"
            )
        return notes


def default_run_dir(config: RunConfig, fmt: Format, folder: Path) -> Path:
    """`<runs root>/imported-<format>-<folder or file name>`."""
    name = Path(folder).absolute().name or "runs"
    return config.runtime.resolved_runs_root() / f"imported-{fmt}-{name}"


def _mtime(path: Path) -> str:
    stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return stamp.isoformat(timespec="milliseconds")


#: The sets a format may lack (surfaced and cited every import has: the latter from the answer).
_OPTIONAL_SETS: tuple[Unavailable, ...] = ("previewed", "opened", "behavior")
_STATUSES: dict[str, Status] = {s: s for s in get_args(Status)}


def _opened_from_result(run: PiSeriniRun) -> list[str] | None:
    """Their `getOpenedDocids` fallback: the docids of the `read_document` calls."""
    calls = [i for i in run.result if i.type == "tool_call" and i.tool_name == "read_document"]
    docids = [str(i.arguments["docid"]) for i in calls if isinstance(i.arguments, dict) and
              isinstance(i.arguments.get("docid"), str | int)]  # fmt: skip
    return docids or None


def _held(run: Run) -> dict[str, list[str]]:
    """The document sets the file lists, under our names."""
    if isinstance(run, BrowseCompPlusRun):
        # Our own export keeps all five sets; theirs has only what the retriever returned.
        held = dict(run.metadata.document_sets or {})
        held.setdefault("surfaced", run.retrieved_docids or [])
        return held
    tiers = {name: getattr(run, key) for name, key in PI_SERINI_TIERS.items()}
    held = {name: docs for name, docs in tiers.items() if docs is not None}
    held.setdefault("surfaced", run.retrieved_docids or [])
    if "opened" not in held and (opened := _opened_from_result(run)) is not None:
        held["opened"] = opened
    return held


def _sets(
    run: Run,
    final: str | None,
    completed: bool,
    exists: Callable[[str], bool],
    tally: _Tally,
    name: str,
) -> tuple[dict[str, list[str]], list[Unavailable]]:
    """The record's document sets, every docid in the corpus, and the sets the file lacks.
    Citations: the file's list when every docid resolves; else (a Pi-Serini list of digit
    fragments, or none) the answer's bracketed references that are docids of the corpus, as
    the agent keeps them. Behavior = opened ∪ cited, as the agent's."""
    held = _held(run)
    sets: dict[str, list[str]] = {}
    for key, docs in held.items():
        if key == "cited" or key not in DOC_SETS:
            continue
        unique = list(dict.fromkeys(docs))
        sets[key] = [d for d in unique if exists(d)]
        tally.drop(key, len(unique) - len(sets[key]), name)
    listed = list(dict.fromkeys(held.get("cited", [])))
    if listed and all(exists(d) for d in listed):
        sets["cited"] = listed
    else:
        if listed:
            tally.rederived.append(name)
            tally.drop("listed cited", sum(1 for d in listed if not exists(d)), name)
        candidates = parse_final_answer(final).cited if completed else []
        sets["cited"] = [d for d in candidates if exists(d)]
        tally.drop("cited", len(candidates) - len(sets["cited"]), name)
    if "opened" in sets:
        sets["behavior"] = list(dict.fromkeys(sets["opened"] + sets["cited"]))
    lacking = [s for s in _OPTIONAL_SETS if s not in sets]
    return {s: sets.get(s, []) for s in DOC_SETS}, lacking


def to_record(
    run: Run,
    source: Source,
    fmt: Format,
    config: RunConfig,
    exists: Callable[[str], bool],
    tally: _Tally,
) -> tuple[QueryRecord, Mapped]:
    """Our record of one run (its run id and config hash are the store's, set when it is
    written), and its usage as mapped. A status other than completed, timeout or failed is a
    failure with that status as its error; only a completed query keeps its answer and
    citations (as `agent/loop.py: build_record`); a completed one without an output_text
    item last has an empty answer."""
    status = _STATUSES.get(run.status, "failed")
    error = None if status == run.status else run.status
    final = final_text(run)
    if isinstance(run, PiSeriniRun) and final is not None and final.startswith("pi stderr:"):
        error, final = final, None  # their harness appends the agent's stderr when it failed
    completed = status == "completed"
    if completed and final is None:
        final = ""
        tally.empty.append(source.name)
    parsed = parse_final_answer(final)
    sets, lacking = _sets(run, final, completed, exists, tally, source.name)
    unavailable: list[Unavailable] = [*lacking, "trajectory", "rankings", "timing"]
    if isinstance(run, BrowseCompPlusRun):
        if run.retrieved_docids is None and not run.metadata.document_sets:
            tally.no_retrieved.append(source.name)
        mapped = browsecomp_plus_usage(run)
        if mapped.unsplit_cache:
            tally.unsplit_cache.append(source.name)
        wall, turns = None, None
    else:
        mapped = Mapped(run.usage)
        wall, turns = run.stats.elapsed_seconds, run.stats.assistant_turns
    if mapped.usage is None:
        unavailable.append("usage")
    if wall is None:
        unavailable.append("wall")
    stamp = _mtime(source.path)
    record = QueryRecord(
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
        usage=mapped.usage or Usage(),
        wall_seconds=wall or 0.0,
        surfaced=sets["surfaced"],
        previewed=sets["previewed"],
        opened=sets["opened"],
        behavior=sets["behavior"],
        started_at=stamp,
        finished_at=stamp,
        imported=ImportedFrom(
            format=fmt,
            directory=str(source.path.parent.absolute()),
            file=source.name,
            unavailable=[u for u in UNAVAILABLE if u in unavailable],
        ),
    )
    return record, mapped


def _files_tsv(folder: Path) -> dict[str, str]:
    """Our Pi-Serini export's `files.tsv` (file -> query id), when the folder has one."""
    path = folder / "files.tsv"
    if not path.is_file():
        return {}
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    return {row[0]: row[1] for row in rows if len(row) >= 2}


@dataclass
class Read:
    """What `read_runs` found: the records (benchmark order), their usage as mapped, the
    files read, the runs skipped, what the files state, and the notes."""

    records: list[QueryRecord]
    usage: dict[str, Mapped]
    folder: Path
    files: int
    skipped: list[SkippedFile]
    stated: Stated
    notes: list[str]


def read_runs(folder: Path, fmt: Format, config: RunConfig, benchmark: Benchmark, log: Log) -> Read:
    """Every run of `folder` as a record, each checked first: its fields, its query (a query
    of the config's slice, once in the folder). Nothing is written here: a bad file stops the
    import before any record is."""
    found = find_runs(folder, fmt, log)
    wanted = {q.query_id for q in benchmark.select(**config.slice.model_dump())}
    known = {q.query_id for q in benchmark.queries}
    named = _files_tsv(found.folder) if fmt == "pi-serini" else {}
    corpus = _Corpus(config, benchmark, log)
    tally = _Tally()
    seen: dict[str, str] = {}
    records, runs, usage = [], [], {}
    skipped = [SkippedFile(file=f, reason=r) for f, r in found.skipped]
    for source in found.sources:
        run = load_run(source, fmt)
        if isinstance(run, str):
            skipped.append(SkippedFile(file=source.name, reason=run))
            continue
        where = f"run file {source.path}" + (f", line {source.line}" if source.line else "")
        qid = run.query_id
        if named.get(source.path.name, qid) != qid:
            raise DataError(
                where,
                f"its query_id is {qid!r} but files.tsv names {named[source.path.name]!r} for "
                "it; correct one of them",
            )
        if qid not in known:
            skipped.append(
                SkippedFile(
                    file=source.name,
                    reason=f"query_id {qid!r} is not a query of benchmark {benchmark.name!r}: "
                    "skipped, as their evaluator skips a query without ground truth",
                )
            )
            continue
        if qid not in wanted:
            raise DataError(
                where,
                f"query_id {qid!r} is not in the config's slice ({config.slice.model_dump()}), "
                "so judge and report would leave it out; import with a config whose slice "
                "holds it (no slice: every query), or move the file out",
            )
        if qid in seen:
            raise DataError(
                where, f"query_id {qid!r} is also the query of {seen[qid]}; keep one run per query"
            )
        seen[qid] = source.name
        record, mapped = to_record(run, source, fmt, config, corpus.exists, tally)
        records.append(record)
        runs.append(run)
        usage[qid] = mapped
    if not records:
        raise DataError(
            found.folder,
            f"none of its {len(found.sources)} runs is a query of benchmark {benchmark.name!r} "
            f"({'; '.join(f'{s.file}: {s.reason}' for s in skipped[:3])}); import with the "
            "config of the benchmark the run was made on (--config)",
        )
    order = {q.query_id: i for i, q in enumerate(benchmark.queries)}
    records.sort(key=lambda r: order[r.query_id])
    return Read(
        records, usage, found.folder, found.files, skipped, stated(fmt, found.folder, runs),
        tally.notes(),
    )  # fmt: skip


def _run_config(config: RunConfig, said: Stated) -> RunConfig:
    """The run directory's config: the import config with what the files state in its place
    (the model; Pi-Serini's BM25 k1, b and timeout), so that pricing and every report name
    the run's model, not ours."""
    update: dict[str, object] = {}
    if said.models:
        update["model"] = config.model.model_copy(update={"name": said.models[0]})
    if said.bm25 is not None:
        bm25 = BM25Params(k1=said.bm25[0], b=said.bm25[1])
        update["retrieval"] = config.retrieval.model_copy(update={"bm25": bm25, "preset": None})
    if said.timeout_seconds:
        update["agent"] = config.agent.model_copy(update={"budget_seconds": said.timeout_seconds})
    return config.model_copy(update=update)


def _cost(config: RunConfig, read: Read, new: list[QueryRecord]) -> CostNote:
    """The run's cost priced with the files' model through the pricing table; n/a with the
    reason when the table does not know it or the files hold no usage."""
    from piserini_ray.metrics.cost import pricing_for

    model = config.model.name if read.stated.models else None
    mapped = [read.usage[r.query_id] for r in new]
    if model is None:
        return CostNote(model=None, priced=False, note="n/a: the run files name no model")
    if not mapped or any(m.usage is None for m in mapped):
        return CostNote(model=model, priced=False, note="n/a: the run files hold no token usage")
    pricing = pricing_for(config)
    price = pricing.price(model)
    if price is None:
        return CostNote(
            model=model,
            priced=False,
            note=f"n/a: model {model!r} (as the run files name it) is not in the pricing table "
            f"{pricing.path or 'configs/pricing.yaml'}; add it there to price this run",
        )
    low = sum(price.cost(m.usage) for m in mapped if m.usage is not None)
    source = f"priced as {model} ({pricing.source(model)})"
    if not any(m.unsplit_cache for m in mapped):
        return CostNote(model=model, priced=True, note=f"${low:,.4f}, {source}", lower_usd=low)
    high = sum(price.cost(u) for m in mapped if (u := m.as_writes()) is not None)
    return CostNote(
        model=model,
        priced=True,
        note=f"a bound, ${low:,.4f} to ${high:,.4f}, {source}: the files sum cache writes and "
        "reads (BrowseComp-Plus's Anthropic client), priced all as reads (the cost shown) and "
        "all as writes",
        lower_usd=low,
        upper_usd=high,
    )


def import_runs(
    folder: Path,
    fmt: Format,
    config: RunConfig,
    run_dir: Path | None = None,
    log: Log = lambda _m: None,
) -> ImportSummary:
    """Import a folder of run files (or one file) into `run_dir` (default: `default_run_dir`),
    over the config's benchmark; queries the run directory holds already are skipped."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if config.run.epochs > 1:
        raise ConfigError(
            "an import is one epoch of a run: set run.epochs to 1 in the config (import each "
            "epoch's folder into a run directory of its own)"
        )
    benchmark = load_benchmark(config.benchmark)
    wanted = benchmark.select(**config.slice.model_dump())
    read = read_runs(folder, fmt, config, benchmark, log)
    config = _run_config(config, read.stated)
    run_dir = run_dir or default_run_dir(config, fmt, folder)
    with RunStore(run_dir, config, log=log) as store:
        done = store.done()
        new = [r for r in read.records if r.query_id not in done]
        for record in new:
            store.append(
                record.model_copy(update={"run_id": store.run_id, "config_hash": store.config_hash})
            )
        directory = store.run_dir
    skipped = len(read.records) - len(new)
    if skipped:
        log(
            f"{skipped} of the {len(read.records)} queries of {folder} already have a record in "
            f"{directory}: skipped, not imported twice"
        )
    said = read.stated
    if len(said.models) > 1:
        read.notes.append(
            f"the files name {len(said.models)} models ({', '.join(said.models)}): the run is "
            f"reported and priced as {said.models[0]}, the most common"
        )
    cost = _cost(config, read, read.records)
    imported = ImportedRun(
        format=fmt,
        source=str(Path(folder).absolute()),
        models=said.models,
        retriever=said.retriever,
        settings=said.settings,
        settings_source=said.sources,
        files_read=read.files,
        imported=len(read.records),
        skipped=read.skipped,
        notes=read.notes,
        cost=cost,
    )
    write_imported(directory, imported)
    lacking = {u for r in new for u in (r.imported.unavailable if r.imported else [])}
    files = {r.query_id for r in read.records}
    return ImportSummary(
        run_dir=str(directory),
        format=fmt,
        source=str(Path(folder).absolute()),
        files_read=read.files,
        imported=len(new),
        skipped=skipped,
        skipped_files=read.skipped,
        without_file=sum(1 for q in wanted if q.query_id not in files),
        statuses=dict(Counter(r.status for r in new)),
        unavailable=[u for u in UNAVAILABLE if u in lacking],
        notes=read.notes,
        settings=settings_text(imported),
        cost=cost.note,
    )
