"""`export --format pi-serini`, read by a reader written from Pi-Serini's own readers
(`summarize_run.ts`, `run_docid_views.ts`, `evaluate_run_with_pi.ts` at v0.3.0): the file
selection, the fields they access, their fallbacks and their confidence parser. Their figures
must equal our report's."""

import os
import re
import shutil
from pathlib import Path

import orjson
import pytest

from piserini_ray.cli import main
from piserini_ray.config import RunConfig

# summarize_run: getRunFiles keeps /^\d+\.json$/ only, sorted by parseInt.
RUN_FILE = re.compile(r"^\d+\.json$")
# evaluate_run_with_pi reads every other *.json but these.
RESERVED = {"benchmark_manifest_snapshot.json", "evaluation_summary.json", "run_setup.json"}
# calibration.ts: the last match wins, clamped to 0..100.
CONFIDENCE = re.compile(r"(?:^|\n)\s*(?:\*\*)?confidence(?:\*\*)?\s*:\s*(\d+(?:\.\d+)?)\s*%?", re.I)


def _docids(value: object) -> list[str]:
    """normalizeDocidArray: arrays only, strings or numbers as strings, first-seen order."""
    if not isinstance(value, list):
        return []
    return list(dict.fromkeys(str(v) for v in value if isinstance(v, str | int | float)))


def _final_text(run: dict) -> str:
    """The response is the last `result` item when it is `output_text`, else empty."""
    last = (run.get("result") or [None])[-1]
    if isinstance(last, dict) and last.get("type") == "output_text":
        return last["output"] if isinstance(last.get("output"), str) else ""
    return ""


def _opened(run: dict) -> list[str]:
    """getOpenedDocids: explicit when non-empty, else the `read_document` calls whose
    arguments are an object with a docid (a JSON string there is skipped)."""
    explicit = _docids(run.get("opened_docids"))
    if explicit:
        return explicit
    found = []
    for item in run.get("result") or []:
        if item.get("type") == "tool_call" and item.get("tool_name") == "read_document":
            args = item.get("arguments")
            if isinstance(args, dict) and isinstance(args.get("docid"), str | int):
                found.append(str(args["docid"]))
    return list(dict.fromkeys(found))


def _qrels(path: Path) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and float(parts[3]) >= 1:
            table.setdefault(parts[0], set()).add(parts[2])
    return table


def test_the_pi_serini_export_reads_as_their_readers_read_it(
    finished_run: tuple[Path, RunConfig], tmp_path: Path
) -> None:
    run_dir, _ = finished_run
    out = tmp_path / "pi"
    assert main(["export", str(run_dir), "--format", "pi-serini", "--out", str(out)]) == 0
    summary = orjson.loads((run_dir / "summary.json").read_bytes())

    jsons = {p.name for p in out.glob("*.json")}
    runs_files = sorted((n for n in jsons if RUN_FILE.match(n)), key=lambda n: int(n[:-5]))
    assert jsons - set(runs_files) == {"benchmark_manifest_snapshot.json"}  # nothing else judged
    assert len(runs_files) == summary["queries"] == 12
    manifest = orjson.loads((out / "benchmark_manifest_snapshot.json").read_bytes())
    assert manifest["benchmark_id"] in {"browsecomp-plus", "benchmark-template"}  # known ids
    for key in ("qrels_path", "secondary_qrels_path", "ground_truth_path", "query_path"):
        # Relative to the folder, so the export travels (test_a_moved_export_reads_the_same).
        assert not Path(manifest[key]).is_absolute() and (out / manifest[key]).is_file()
    evidence = _qrels(out / manifest["qrels_path"])
    truth = {
        str(row["query_id"]): row
        for row in map(
            orjson.loads, (out / manifest["ground_truth_path"]).read_bytes().splitlines()
        )
    }

    records = {
        r["query_id"]: r
        for r in map(orjson.loads, (run_dir / "records.jsonl").read_bytes().splitlines())
    }
    recalls: dict[str, list[float]] = {"surfaced": [], "previewed": [], "agent": []}
    ids = []
    for name in runs_files:
        run = orjson.loads((out / name).read_bytes())
        qid = str(run["query_id"])
        ids.append(qid)
        assert run["status"] in {"completed", "timeout", "failed"}
        assert run["metadata"]["query"] == truth[qid]["query"] and run["metadata"]["model"]
        calls = [i for i in run["result"] if i["type"] == "tool_call"]
        assert calls and all(isinstance(c["arguments"], dict) for c in calls)
        assert (
            run["stats"]["tool_calls_total"] == len(calls) == sum(run["tool_call_counts"].values())
        )
        text = _final_text(run)
        assert text, "a completed query's answer is the last result item"
        stated = [float(m) for m in CONFIDENCE.findall(text)]
        record_conf = min(100.0, max(0.0, stated[-1])) if stated else 100.0
        # Their parser and ours read the same confidence from the same answer.
        assert record_conf == records[qid]["confidence"]
        views = {
            "surfaced": _docids(run.get("surfaced_docids") or run.get("retrieved_docids")),
            "previewed": _docids(run.get("previewed_docids")),
            "agent": _docids(run.get("agent_docids"))
            or list(dict.fromkeys(_opened(run) + _docids(run.get("cited_docids")))),
        }
        gold = evidence.get(qid, set())
        if gold:  # evaluate_run_with_pi's macro leaves out queries without positives
            for tier, docs in views.items():
                recalls[tier].append(len(gold & set(docs)) / len(gold))
    assert sorted(ids) == sorted(truth)
    ours = summary["recall"]
    for tier, theirs in (
        ("surfaced", "surfaced"),
        ("previewed", "previewed"),
        ("agent", "behavior"),
    ):
        assert sum(recalls[tier]) / len(recalls[tier]) == pytest.approx(
            ours[theirs]["evidence"]["macro"]["value"]
        )


def _node_resolve(cwd: Path, path: str) -> Path:
    """Node's `path.resolve(path)`: `path` itself when absolute, else joined to the process's
    working directory, normalized."""
    return Path(os.path.normpath(os.path.join(cwd, path)))


def summarize_as_pi_serini(run_dir: Path, cwd: Path) -> dict[str, object]:
    """Pi-Serini's `summarize_run` (v0.3.0) figures, resolving paths their way:
    `src/benchmarks/run_manifest.ts:16-18` finds `benchmark_manifest_snapshot.json` in the run
    root (the run dir, or its parent when it is `merged/`); `src/evaluation/summarize_run.ts:121`
    and `:123` take `qrels_path` / `secondary_qrels_path` from it; `:218` reads
    `readQrels(resolve(qrelsPath))`, Node's `resolve` against the process's working directory
    `cwd`, not against the run folder. Macro recall divides by every run file (`:241`)."""
    root = run_dir.parent if run_dir.name == "merged" else run_dir
    manifest = orjson.loads((root / "benchmark_manifest_snapshot.json").read_bytes())
    files = sorted(
        (p.name for p in run_dir.glob("*.json") if RUN_FILE.match(p.name)),
        key=lambda n: int(n[:-5]),
    )
    runs = [orjson.loads((run_dir / name).read_bytes()) for name in files]
    figures: dict[str, object] = {
        "processed": len(runs),
        "status": sorted(r["status"] for r in runs),
    }
    for key in ("qrels_path", "secondary_qrels_path"):
        qrels = _qrels(_node_resolve(cwd, manifest[key]))  # ENOENT if it does not resolve
        for tier, docids in (
            ("surfaced", lambda r: _docids(r.get("surfaced_docids") or r.get("retrieved_docids"))),
            ("previewed", lambda r: _docids(r.get("previewed_docids"))),
            (
                "agent",
                lambda r: (
                    _docids(r.get("agent_docids"))
                    or list(dict.fromkeys(_opened(r) + _docids(r.get("cited_docids"))))
                ),
            ),
        ):
            hits, gold, macro = 0, 0, 0.0
            for run in runs:
                wanted = qrels.get(str(run["query_id"]), set())
                found = len(wanted & set(docids(run)))
                hits, gold = hits + found, gold + len(wanted)
                macro += found / len(wanted) if wanted else 0.0
            figures[f"{key}/{tier}"] = (hits, gold, macro / len(runs) if runs else 0.0)
    return figures


def test_a_moved_export_reads_the_same(
    finished_run: tuple[Path, RunConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Export, read it as Pi-Serini does from inside the folder, MOVE the folder elsewhere
    under another name, and read it again from inside: the same figures; nothing in any export
    (Pi-Serini, BrowseComp-Plus, TREC) names a path of the machine that wrote it."""
    run_dir, _ = finished_run
    out = tmp_path / "written" / "pi"
    assert main(["export", str(run_dir), "--format", "pi-serini", "--out", str(out)]) == 0
    monkeypatch.chdir(out)
    before = summarize_as_pi_serini(out, cwd=out)
    assert before["processed"] == 12 and before["qrels_path/surfaced"][1] > 0  # type: ignore[index]

    moved = tmp_path / "elsewhere" / "travelled"
    moved.parent.mkdir()
    shutil.move(out, moved)
    assert not out.exists()
    monkeypatch.chdir(moved)
    assert summarize_as_pi_serini(moved, cwd=moved) == before
    # Their rule is the working directory's: from elsewhere, the names do not resolve.
    with pytest.raises(FileNotFoundError):
        summarize_as_pi_serini(moved, cwd=tmp_path)

    # No absolute paths anywhere, in any format.
    for fmt in ("browsecomp-plus", "trec"):
        assert main(["export", str(run_dir), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
    machine = [str(tmp_path), str(run_dir), str(run_dir.parent), str(Path.home())]
    for folder in (moved, tmp_path / "browsecomp-plus", tmp_path / "trec"):
        files = [p for p in folder.rglob("*") if p.is_file()]
        assert files
        for path in files:
            text = path.read_text()
            assert not any(m in text for m in machine), f"{path} names a local path"
    manifest = orjson.loads((moved / "benchmark_manifest_snapshot.json").read_bytes())
    assert not any(Path(v).is_absolute() for k, v in manifest.items() if k.endswith("_path"))
