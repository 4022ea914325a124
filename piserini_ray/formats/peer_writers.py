"""Exports of a run for other tools: BrowseComp-Plus run files (and their leaderboard's
`evaluation_summary.json`), Pi-Serini run folders and TREC runs."""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from piserini_ray.data import Benchmark, Qrels
from piserini_ray.metrics.recall import DOC_SETS
from piserini_ray.records import Judgement, QueryRecord, RankingLog
from piserini_ray.store.report_files import write_report_file


def document_sets(record: QueryRecord) -> dict[str, list[str]]:
    """The record's document sets (docs/spec.md §5) that it holds: a set an imported record's format
    lacks is left out, so that whoever reads the export never takes it for an empty one."""
    return {name: list(getattr(record, name)) for name in DOC_SETS if record.has(name)}


def browsecomp_plus_run(record: QueryRecord) -> dict[str, Any]:
    """One query in the BrowseComp-Plus run format (docs/spec.md §5), so that their scripts
    read our runs.

    `retrieved_docids` are the documents the agent was shown (previewed) or opened, the closest
    match to what their search tool returns (a record imported without those sets: its
    surfaced set, which is what their retriever returned); every tool call becomes a
    `tool_call` item with its observation, model text between calls a `reasoning` item, and
    the final answer `output_text`. `metadata.document_sets` (an extension their readers
    ignore) keeps all five sets, so `piserini-ray import` restores them; `usage` is left out
    when the record's tokens are unknown.
    """
    result: list[dict[str, Any]] = []
    for turn in record.trajectory:
        if turn.tool_calls and turn.model_output:
            result.append(
                {
                    "type": "reasoning",
                    "tool_name": None,
                    "arguments": None,
                    "output": turn.model_output,
                }
            )
        for call in turn.tool_calls:
            result.append(
                {
                    "type": "tool_call",
                    "tool_name": call.name,
                    "arguments": call.arguments,
                    "output": call.observation,
                }
            )
    result.append(
        {
            "type": "output_text",
            "tool_name": None,
            "arguments": None,
            "output": record.final_answer or "",
        }
    )
    shown = record.has("previewed") and record.has("opened")
    retrieved = list(dict.fromkeys(record.previewed + record.opened if shown else record.surfaced))
    run: dict[str, Any] = {
        "query_id": record.query_id,
        "tool_call_counts": record.tool_call_counts,
        "status": record.status,
        "retrieved_docids": retrieved,
        "result": result,
        "metadata": {
            "model": record.model,
            "run_id": record.run_id,
            "config_hash": record.config_hash,
            "framework": "piserini_ray",
            "document_sets": document_sets(record),
        },
    }
    if record.has("usage"):
        # Their OpenAI clients' meaning: input counts every input token, cached ones included;
        # cache writes (Anthropic) ride along as our extension, apart from the reads.
        run["usage"] = {
            "input_tokens": record.usage.input_tokens,
            "input_tokens_cached": record.usage.cached_tokens,
            "output_tokens": record.usage.output_tokens,
            "included_reasoning_tokens": record.usage.reasoning_tokens,
            "total_tokens": record.usage.input_tokens + record.usage.output_tokens,
            "reasoning_tokens": record.usage.reasoning_tokens,
            "cache_write_tokens": record.usage.cache_write_tokens,
        }
    return run


#: A query id that is a file name as it is: no `/`, short enough for any file system.
_SAFE = re.compile(r"[A-Za-z0-9._-]{1,200}")


def run_file_name(query_id: str, n: int) -> str:
    """`run_<query id>.json` (`run_<n>.json` for an id that is not a safe file name): their
    clients name files `run_<time>.json` and their `evaluate_run.py` (b90a68c) reads only
    `run_*.json`."""
    return f"run_{query_id if _SAFE.fullmatch(query_id) else f'{n:06d}'}.json"


def export_browsecomp_plus(
    records: list[QueryRecord],
    out: Path,
    judgements: dict[str, Judgement] | None = None,
    evidence: Qrels | None = None,
    retriever: str = "change me when submitting",
) -> list[Path]:
    """One `run_*.json` per query, and, when the evidence qrels are given, their leaderboard
    submission `evaluation_summary.json` (`evaluation_summary`)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, record in enumerate(records, start=1):
        path = out / run_file_name(record.query_id, n)
        write_report_file(
            path, orjson.dumps(browsecomp_plus_run(record), option=orjson.OPT_INDENT_2)
        )
        paths.append(path)
    if evidence is not None:
        summary = evaluation_summary(records, judgements or {}, evidence, retriever)
        path = out / "evaluation_summary.json"
        write_report_file(path, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        paths.append(path)
    return paths


def _their_calib_err(confidence: np.ndarray, correct: np.ndarray, beta: int = 100) -> float:
    """`calib_err` of their evaluate_run.py (p=2, bins of `beta`, the loop stopping one bin
    short of the last), with their sort (numpy's default, not stable)."""
    idxs = np.argsort(confidence)
    confidence, correct = confidence[idxs], correct[idxs]
    bins = [[i * beta, (i + 1) * beta] for i in range(len(confidence) // beta)]
    bins[-1] = [bins[-1][0], len(confidence)]
    cerr = 0.0
    for lo, hi in bins[:-1]:
        difference = abs(np.nanmean(confidence[lo:hi]) - np.nanmean(correct[lo:hi]))
        cerr += (hi - lo) / len(confidence) * difference**2
    return float(np.sqrt(cerr))


def evaluation_summary(
    records: list[QueryRecord],
    judgements: dict[str, Judgement],
    evidence: Qrels,
    retriever: str,
    today: str | None = None,
) -> dict[str, Any]:
    """Their leaderboard submission as their `evaluate_run.py` (b90a68c) computes it over the
    exported files: `Accuracy (%)` = correct / all files (a query without a verdict, a judge
    failure, an incomplete run or an empty answer is not correct); `Recall (%)` = the mean,
    over queries with evidence qrels, of the share of them in `retrieved_docids`;
    `avg_tool_stats` = each tool's calls / all files; `Calibration Error (%)` = their
    `calib_err` over the judged completed answers with the response's confidence as their
    grader extracts it (the judge's extracted value under `judge.template: browsecomp-plus`,
    else our parse of the same `Confidence:` line, 100 when none), 0.0 below 100 of them as
    their script prints it; `LLM` the first file's model; `Link` left for the submitter."""
    tools: dict[str, float] = defaultdict(int)
    confidences: list[float] = []
    right: list[bool] = []
    recalls: list[float] = []
    per_query: list[dict[str, Any]] = []
    correct_count = 0
    for record in records:
        for name, count in record.tool_call_counts.items():
            tools[name] += count
        verdict = judgements.get(record.query_id)
        correct = bool(verdict and verdict.status == "judged" and verdict.correct)
        correct_count += correct
        answered = record.status == "completed" and bool(record.final_answer)
        if answered and verdict is not None and verdict.status == "judged":
            theirs = getattr(verdict, "template", "piserini") == "browsecomp-plus"
            confidence = verdict.confidence if theirs else record.confidence
            if confidence is not None:
                confidences.append(min(100.0, confidence))
                right.append(bool(verdict.correct))
        positives = set(evidence.get(record.query_id, {}))
        retrieved = set(browsecomp_plus_run(record)["retrieved_docids"])
        recall = len(retrieved & positives) / len(positives) if positives else None
        if recall is not None:
            recalls.append(recall)
        per_query.append(
            {
                "query_id": record.query_id,
                "correct": correct,
                "recall": None if recall is None else round(recall * 100.0, 2),
            }
        )
    n = len(records)
    calibration = 0.0
    if len(confidences) >= 100:
        calibration = 100 * _their_calib_err(
            np.array(confidences) / 100.0, np.array(right, dtype=float)
        )
    return {
        "LLM": records[0].model if records else "change me when submitting",
        "Accuracy (%)": round(100.0 * correct_count / n, 2) if n else 0.0,
        "Recall (%)": round(100.0 * float(np.mean(recalls)), 2) if recalls else None,
        "avg_tool_stats": {name: count / n for name, count in tools.items()},
        "Calibration Error (%)": round(calibration, 2),
        "Retriever": retriever,
        "Link": "change me when submitting",
        "Evaluation Date": today or date.today().isoformat(),
        "per_query_metrics": per_query,
    }


#: Our document sets under Pi-Serini's names for its docid tiers (`run_pi_benchmark.ts`).
PI_SERINI_TIERS = {
    "surfaced": "surfaced_docids",
    "previewed": "previewed_docids",
    "opened": "opened_docids",
    "cited": "cited_docids",
    "behavior": "agent_docids",
}


def pi_serini_run(record: QueryRecord, question: str | None) -> dict[str, Any]:
    """One query as Pi-Serini's harness writes it (`run_pi_benchmark.ts`), so that its
    `summarize_run` and `evaluate_run_with_pi` read it unchanged: tool calls as `tool_call`
    items with their arguments as objects (as the model sent them when they do not parse), the
    final answer as the last item (their readers take only the last), the docid tiers under
    their names (`agent_docids` = opened or cited: our behavior set), `stats` counts, and our
    usage as an extra field they ignore. What an imported record lacks is left out (a tier,
    the usage) or null (the elapsed seconds), never written as empty or zero."""
    result: list[dict[str, Any]] = []
    for turn in record.trajectory:
        for call in turn.tool_calls:
            try:
                arguments: Any = orjson.loads(call.arguments)
            except orjson.JSONDecodeError:
                arguments = call.arguments
            result.append(
                {
                    "type": "tool_call",
                    "tool_name": call.name,
                    "arguments": arguments,
                    "output": call.observation,
                }
            )
    if record.final_answer is not None:
        result.append(
            {
                "type": "output_text",
                "tool_name": None,
                "arguments": None,
                "output": record.final_answer,
            }
        )
    counts = record.tool_call_counts
    run: dict[str, Any] = {
        "query_id": record.query_id,
        "status": record.status,
        "metadata": {"model": record.model, "query": question, "framework": "piserini_ray"},
        "tool_call_counts": counts,
        **{PI_SERINI_TIERS[name]: docs for name, docs in document_sets(record).items()},
        "stats": {
            "elapsed_seconds": record.wall_seconds if record.has("wall") else None,
            "tool_calls_total": sum(counts.values()),
            "search_calls": counts.get("search", 0),
            "read_search_results_calls": counts.get("read_search_results", 0),
            "read_document_calls": counts.get("read_document", 0),
            "timed_out": record.status == "timeout",
        },
        "result": result,
    }
    if record.has("usage"):
        run["usage"] = record.usage.model_dump()
    return run


def _write_qrels(qrels: Qrels, path: Path) -> str:
    """The qrels file, and its name as the manifest gives it (relative to the folder)."""
    lines = [f"{q} 0 {d} {rel}" for q, docs in sorted(qrels.items()) for d, rel in docs.items()]
    write_report_file(path, "\n".join(lines) + ("\n" if lines else ""))
    return path.name


def export_pi_serini(records: list[QueryRecord], benchmark: Benchmark, out: Path) -> list[Path]:
    """A run folder Pi-Serini's readers take as it is: one `<n>.json` per query (their
    `summarize_run` reads only all-digit names: an all-digit query id is its own name, else
    the query's place in the run, listed in `files.tsv`), and `benchmark_manifest_snapshot.json`
    naming the qrels, gold answers and questions written beside them by their bare file names,
    so the folder travels: Pi-Serini resolves a manifest path with Node's `path.resolve`, that
    is against the process's working directory (`summarize_run.ts` reads `qrels_path` at line
    121 and opens `resolve(qrelsPath)` at line 218; `evaluate_run_with_pi.ts` alike), so run
    their readers from inside the folder (`cd DIR && <pi-serini>/node_modules/.bin/tsx
    <pi-serini>/src/evaluation/summarize_run.ts --runDir .`), wherever it was copied; an
    absolute path would break as soon as the folder moves. No other `.json` file: their
    evaluator reads every one."""
    out.mkdir(parents=True, exist_ok=True)
    questions = {q.query_id: q for q in benchmark.queries}
    numeric = all(
        r.query_id.isascii() and r.query_id.isdigit() and len(r.query_id) <= 200 for r in records
    )
    paths, names = [], []
    for n, record in enumerate(records, start=1):
        name = f"{record.query_id}.json" if numeric else f"{n}.json"
        query = questions.get(record.query_id)
        run = pi_serini_run(record, query.query if query else None)
        write_report_file(out / name, orjson.dumps(run, option=orjson.OPT_INDENT_2))
        paths.append(out / name)
        names.append(f"{name}\t{record.query_id}")
    write_report_file(out / "files.tsv", "file\tquery_id\n" + "\n".join(names) + "\n")
    wanted = [questions[r.query_id] for r in records if r.query_id in questions]
    truth = out / "ground_truth.jsonl"
    write_report_file(
        truth,
        b"".join(
            orjson.dumps({"query_id": q.query_id, "query": q.query, "answer": q.answer}) + b"\n"
            for q in wanted
        ),
    )
    write_report_file(
        out / "queries.tsv", "".join(f"{q.query_id}\t{' '.join(q.query.split())}\n" for q in wanted)
    )
    ids = [q.query_id for q in wanted]

    def of_run(table: Qrels) -> Qrels:
        return {q: table[q] for q in ids if q in table}

    manifest = {
        # Their known ids: browsecomp-plus, or their template for any other benchmark.
        "benchmark_id": "browsecomp-plus"
        if benchmark.name.startswith("browsecomp-plus")
        else "benchmark-template",
        "benchmark_display_name": benchmark.name,
        # Names relative to the folder, never absolute: the export is relocatable.
        "query_path": "queries.tsv",
        "qrels_path": _write_qrels(of_run(benchmark.evidence), out / "qrel_evidence.txt"),
        "secondary_qrels_path": _write_qrels(of_run(benchmark.gold), out / "qrel_gold.txt"),
        "ground_truth_path": truth.name,
    }
    write_report_file(
        out / "benchmark_manifest_snapshot.json", orjson.dumps(manifest, option=orjson.OPT_INDENT_2)
    )
    return paths


def merged_ranking(searches: list[RankingLog]) -> list[str]:
    """A query's searches as one ranking: each document at its best rank in any search (ties
    go to the earlier search), so trec_eval / ranx see what the agent could have reached."""
    best: dict[str, tuple[int, int]] = {}
    for order, search in enumerate(searches):
        for rank, docid in enumerate(search.docids, start=1):
            key = (rank, order)
            if docid not in best or key < best[docid]:
                best[docid] = key
    return sorted(best, key=lambda d: best[d])


def export_trec(rankings: dict[str, list[RankingLog]], out: Path, tag: str) -> list[Path]:
    """`first-search.trec` (each query's first ranking, as issued) and `merged.trec`."""
    out.mkdir(parents=True, exist_ok=True)
    runs = {
        "first-search.trec": {q: s[0].docids for q, s in rankings.items() if s},
        "merged.trec": {q: merged_ranking(s) for q, s in rankings.items() if s},
    }
    return [write_trec(dict(sorted(r.items())), out / name, tag) for name, r in runs.items()]


def write_trec(ranked: dict[str, list[str]], path: Path, tag: str) -> Path:
    """A TREC run file: `qid Q0 docid rank score tag`, scores descending by rank."""
    lines = [
        f"{qid} Q0 {docid} {rank} {len(docids) - rank + 1} {tag}"
        for qid, docids in ranked.items()
        for rank, docid in enumerate(docids, start=1)
    ]
    return write_report_file(path, "\n".join(lines) + "\n")
