"""Issue 29: run files written by the peers' OWN code import as their evaluators read them, and
our figures equal the figures their own code computes on the same files (both recorded in
`tests/fixtures/peers/`, made by `tests/fixtures/peers/regenerate.py` from BrowseComp-Plus
97c637c / b90a68c and Pi-Serini v0.3.0; these tests need neither repository)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from piserini_ray.cli import main
from piserini_ray.config import load_config
from piserini_ray.data import load_benchmark
from piserini_ray.metrics.cost import load_pricing
from piserini_ray.records import Usage

PEERS = Path(__file__).parents[1] / "fixtures" / "peers"
BCP = PEERS / "browsecomp-plus"
PI = PEERS / "pi-serini"


def _json(path: Path) -> dict:
    return orjson.loads(path.read_bytes())


def _records(run_dir: Path) -> dict[str, dict]:
    rows = [orjson.loads(x) for x in (run_dir / "records.jsonl").read_bytes().splitlines()]
    return {r["query_id"]: r for r in rows}


def _verdicts(run_dir: Path) -> dict[str, bool]:
    (path,) = (run_dir / "judgements").glob("*.jsonl")
    return {r["query_id"]: r["correct"] for r in map(orjson.loads, path.read_bytes().splitlines())}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """Our config over the fixture benchmark (the sample's paragraphs, query ids 1..8, q-9,
    q-10), judged by the offline exact-match judge; a pricing table that also knows the dated
    Anthropic name their client writes."""
    pricing = tmp_path / "pricing.yaml"
    table = (Path(__file__).parents[2] / "configs" / "pricing.yaml").read_text()
    pricing.write_text(
        table + "  claude-haiku-4-5-20251001: {input: 1.00, output: 5, cache_read: 0.10, "
        "cache_write: 1.25}\n"
    )
    b = PEERS / "benchmark"
    path = tmp_path / "peers.yaml"
    path.write_text(
        f"benchmark: {{source: jsonl, name: peers-fixture, queries: '{b / 'queries.jsonl'}', "
        f"corpus: '{b / 'corpus.jsonl'}', qrels_evidence: '{b / 'qrels_evidence.txt'}', "
        f"qrels_gold: '{b / 'qrels_gold.txt'}'}}\n"
        "judge: {model: {name: offline/exact-match-judge}}\n"
        f"runtime: {{runs_root: '{tmp_path / 'runs'}'}}\n"
        f"pricing: {{table: '{pricing}'}}\n"
    )
    return path


def _import(source: Path, fmt: str, config: Path, run_dir: Path) -> int:
    return main(["import", str(source), "--format", fmt, "--config", str(config),
                 "--run-dir", str(run_dir)])  # fmt: skip


def _imported_and_judged(source: Path, fmt: str, config: Path, run_dir: Path) -> dict:
    assert _import(source, fmt, config, run_dir) == 0
    assert main(["judge", str(run_dir)]) == 0
    return _json(run_dir / "summary.json")


def _corpus() -> set[str]:
    lines = (PEERS / "benchmark" / "corpus.jsonl").read_bytes().splitlines()
    return {orjson.loads(x)["docid"] for x in lines}


def _only_corpus_docids(records: dict[str, dict]) -> None:
    corpus = _corpus()
    for record in records.values():
        for name in ("surfaced", "previewed", "opened", "cited", "behavior"):
            assert set(record[name]) <= corpus, (record["query_id"], name)


def _same_as_their_evaluator(ours: dict, run_dir: Path, theirs: dict) -> None:
    """Our figures beside their evaluate_run.py's on the same files (scripted grader)."""
    summary = theirs["evaluation_summary"]
    assert ours["queries"] == len(theirs["files_evaluated"])
    assert round(100 * ours["accuracy"]["value"], 2) == summary["Accuracy (%)"]
    recall = ours["recall"]["surfaced"]["evidence"]["macro"]["value"]
    assert round(100 * recall, 2) == summary["Recall (%)"]
    tools = {k: v for k, v in ours["tool_calls_per_query"].items() if k != "total"}
    assert tools == pytest.approx(summary["avg_tool_stats"])
    assert _verdicts(run_dir) == {q["query_id"]: q["correct"] for q in summary["per_query_metrics"]}
    # Under 100 answers their script prints 0.0; ours is undefined under 200 and says so.
    assert summary["Calibration Error (%)"] == 0.0
    assert ours["calibration_error"]["browsecomp-plus"] is None


def test_their_openai_files_import_as_their_evaluator_reads_them(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "openai"
    capsys.readouterr()
    ours = _imported_and_judged(BCP / "openai", "browsecomp-plus", config, run_dir)
    printed = capsys.readouterr().out
    _same_as_their_evaluator(ours, run_dir, _json(BCP / "expected" / "openai.json"))
    # The summary names every file it skipped and what it changed.
    assert "read 9 file(s); 1 run(s) skipped" in printed
    assert "skipped run_20250801T000008000000Z.json: query_id is null" in printed
    empty = "run_20250801T000003000000Z.json, run_20250801T000004000000Z.json"
    assert re.search(r"note: 2 completed run\(s\) whose last result item is not output_text.*"
                     + re.escape(empty), printed)  # fmt: skip
    assert "2 cited docid(s) not in the corpus dropped from 1 run(s)" in printed
    records = _records(run_dir)
    # --max-iterations (4) and an empty final message (5): completed, an empty answer, wrong.
    for qid in ("4", "5"):
        assert records[qid]["status"] == "completed" and records[qid]["final_answer"] == ""
    assert records["6"]["status"] == "failed" and records["6"]["error"] == "incomplete"
    assert records["8"]["cited"] == []  # [msq-000000000000] and [12345] are not documents
    _only_corpus_docids(records)
    # Priced with the files' model through the table, not the config's: gpt-5, never $0.
    assert ours["model"] == "gpt-5"
    price = load_pricing().price("gpt-5")
    assert price is not None
    usage = [
        _json(p)["usage"] for p in sorted((BCP / "openai").glob("run_*.json"))
        if _json(p)["query_id"] is not None
    ]  # fmt: skip
    cost = sum(price.cost(Usage(input_tokens=u["input_tokens"], cached_tokens=u[
        "input_tokens_cached"], output_tokens=u["output_tokens"])) for u in usage)  # fmt: skip
    assert ours["cost_usd"] == pytest.approx(round(cost, 4)) and cost > 0
    # The report names the files' model and settings, never the import config's.
    report = (run_dir / "report.md").read_text()
    assert "k1=25" not in report and "budget 300 s" not in report
    assert "model gpt-5, retriever unknown (BrowseComp-Plus run files do not state it)" in report
    assert "reasoning effort medium" in report
    manifest = _json(run_dir / "manifest.json")
    assert manifest["config"]["model"]["name"] == "gpt-5"


def test_their_published_jsonl_reads_as_their_run_files(config: Path, tmp_path: Path) -> None:
    """One JSON object per line, as their download_and_decrypt_run.py writes it: the same
    runs as the OpenAI folder it was made from (a file or its folder)."""
    folder = _imported_and_judged(BCP / "openai", "browsecomp-plus", config, tmp_path / "a")
    jsonl = BCP / "published" / "bm25" / "gpt5.jsonl"
    for n, source in enumerate((jsonl, jsonl.parent)):
        published = _imported_and_judged(source, "browsecomp-plus", config, tmp_path / f"b{n}")
        for key in ("queries", "statuses", "accuracy", "recall", "cost_usd", "model"):
            assert published[key] == folder[key], key
        imported = _json(tmp_path / f"b{n}" / "imported.json")
        assert imported["files_read"] == 1
        assert imported["skipped"][0]["file"] == "gpt5.jsonl:9"


def test_their_anthropic_usage_is_a_bound_never_silently(config: Path, tmp_path: Path) -> None:
    """Their Anthropic client writes uncached input and the sum of cache writes and reads:
    the cost is priced both ways and reported as a bound."""
    run_dir = tmp_path / "anthropic"
    ours = _imported_and_judged(BCP / "anthropic", "browsecomp-plus", config, run_dir)
    _same_as_their_evaluator(ours, run_dir, _json(BCP / "expected" / "anthropic.json"))
    records = _records(run_dir)
    first = _json(BCP / "anthropic" / "run_20250802T000000Z.json")["usage"]
    assert first == {"input_tokens": 1200, "input_tokens_cached": 12000, "output_tokens": 400,
                     "included_reasoning_tokens": None, "total_tokens": 1600}  # fmt: skip
    assert records["1"]["usage"]["input_tokens"] == 1200 + 12000
    assert records["1"]["usage"]["cached_tokens"] == 12000  # taken as reads: the lower bound
    assert records["2"]["usage"]["cached_tokens"] == 0  # null: no cache at all
    # $ per 1M: input 1, cache read 0.10, cache write 1.25, output 5.
    low = (1200 * 1 + 12000 * 0.10 + 400 * 5 + 2500 + 300 * 5 + 800 + 1000 * 0.10 + 1000 * 5) / 1e6
    high = low + (12000 + 1000) * (1.25 - 0.10) / 1e6
    assert ours["cost_usd"] == pytest.approx(round(low, 4))
    cost = _json(run_dir / "imported.json")["cost"]
    assert cost["lower_usd"] == pytest.approx(low) and cost["upper_usd"] == pytest.approx(high)
    report = (run_dir / "report.md").read_text()
    assert f"Cost: a bound, ${low:,.4f} to ${cost['upper_usd']:,.4f}, priced as " in report
    assert "claude-haiku-4-5-20251001" in report and "input_tokens_cached sums cache" in report


def test_a_model_the_table_does_not_know_is_n_a_with_the_reason(
    config: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(re.sub(r"(?m)^pricing:.*\n", "", config.read_text()))
    run_dir = tmp_path / "anthropic"
    ours = _imported_and_judged(BCP / "anthropic", "browsecomp-plus", plain, run_dir)
    assert ours["cost_usd"] is None and ours["model"] == "claude-haiku-4-5-20251001"
    assert (
        "model 'claude-haiku-4-5-20251001' (as the run files name it) is not in the pricing "
        in ((run_dir / "report.md").read_text())
    )


def test_a_qwen_reasoning_only_final_is_an_empty_answer(config: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "qwen"
    ours = _imported_and_judged(BCP / "qwen", "browsecomp-plus", config, run_dir)
    _same_as_their_evaluator(ours, run_dir, _json(BCP / "expected" / "qwen.json"))
    records = _records(run_dir)
    assert records["1"]["status"] == "completed" and records["1"]["final_answer"] == ""
    assert records["3"]["status"] == "failed" and records["3"]["error"] == "incomplete"
    assert ours["cost_usd"] is None  # their Qwen client writes no usage


def _summarize_run(ours: dict) -> dict[str, float]:
    """Our figures under the names of Pi-Serini's summarize_run output."""
    names = {"surfaced": "system-surfaced", "previewed": "agent-previewed"}
    return {
        f"{kind} {names[s]} {q}": round(ours["recall"][s][q][kind]["value"], 4)
        for s in names
        for q in ("evidence", "gold")
        for kind in ("macro", "micro")
    }


def test_a_pi_serini_run_of_their_harness_matches_their_summarize_run(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "pi"
    capsys.readouterr()
    ours = _imported_and_judged(PI / "run", "pi-serini", config, run_dir)
    printed = capsys.readouterr().out
    theirs = _json(PI / "expected" / "summarize_run.json")["figures"]
    mine = _summarize_run(ours)
    assert mine == {k: v for k, v in theirs.items() if k in mine}
    # Their agent-behavior set is opened ∪ digit fragments of the citations: our opened set.
    for q in ("evidence", "gold"):
        for kind in ("macro", "micro"):
            opened = ours["recall"]["opened"][q][kind]["value"]
            assert round(opened, 4) == theirs[f"{kind} agent-behavior {q}"]
            assert ours["recall"]["behavior"][q][kind]["value"] >= opened
    records = _records(run_dir)
    _only_corpus_docids(records)
    first = _json(PI / "run" / "1.json")
    assert first["cited_docids"] == ["7976", "1", "35", "0", "9107", "33838"]  # their fragments
    assert records["1"]["cited"] == re.findall(
        r"\[(msq-[0-9a-f]+)\]", first["result"][-1]["output"]
    )
    assert "cited_docids of 6 run(s) did not resolve in the corpus" in printed
    # The run's own model and settings (run_setup.json), never ours.
    assert ours["model"] == "openai-codex/gpt-5.4-mini"
    report = (run_dir / "report.md").read_text()
    assert "retriever BM25 k1=0.9 b=0.4" in report and "timeoutSeconds 30" in report
    assert "k1=25" not in report and "budget 300 s" not in report
    assert ours["cost_usd"] is None  # their harness writes no usage


def test_a_sharded_pi_serini_run_with_ids_not_all_digits_reads_merged(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "sharded"
    capsys.readouterr()
    assert _import(PI / "sharded", "pi-serini", config, run_dir) == 0
    assert "sharded Pi-Serini run: reading its merged/ folder" in capsys.readouterr().err
    records = _records(run_dir)
    assert set(records) == {str(n) for n in range(1, 9)} | {"q-9", "q-10"}
    _only_corpus_docids(records)
    # Their summarize_run finds merged/ too but reads its all-digit names only (8 of 10): over
    # those 8 our surfaced recall is theirs; their evaluate_run_with_pi reads all 10, as we do.
    theirs = _json(PI / "expected" / "summarize_run_sharded.json")
    assert theirs["processed_queries"] == 8
    evidence: dict[str, set[str]] = {}
    for line in (PEERS / "benchmark" / "qrels_evidence.txt").read_text().splitlines():
        qid, _, docid, _ = line.split()
        evidence.setdefault(qid, set()).add(docid)
    digits = [r for q, r in records.items() if q.isdigit()]
    macro = sum(len(set(r["surfaced"]) & evidence[r["query_id"]]) / len(evidence[r["query_id"]])
                for r in digits) / len(digits)  # fmt: skip
    assert round(macro, 4) == theirs["figures"]["macro system-surfaced evidence"]


def test_our_browsecomp_plus_export_is_what_their_evaluator_reads(
    config: Path, tmp_path: Path
) -> None:
    """Their evaluate_run.py (b90a68c) read our export of their OpenAI run (recorded at
    regeneration): the files it found and its figures; ours: the same names and the fields
    their reader takes, and the same leaderboard summary written beside them."""
    run_dir, out = tmp_path / "openai", tmp_path / "export"
    _imported_and_judged(BCP / "openai", "browsecomp-plus", config, run_dir)
    assert main(["export", str(run_dir), "--format", "browsecomp-plus", "--out", str(out)]) == 0
    recorded = _json(BCP / "expected" / "our-export.json")
    files = sorted(p.name for p in out.glob("run_*.json"))
    assert files == recorded["files_evaluated"]
    assert {p.name for p in out.iterdir()} == {*files, "evaluation_summary.json"}
    truth = {orjson.loads(x)["query_id"] for x in (PEERS / "benchmark" / "ground_truth.jsonl")
             .read_bytes().splitlines()}  # fmt: skip
    for name in files:
        run = _json(out / name)
        assert str(run["query_id"]) in truth and run["status"] in ("completed", "failed")
        assert isinstance(run["retrieved_docids"], list) and isinstance(
            run["tool_call_counts"], dict
        )
        assert run["result"] and {"type", "output"} <= set(run["result"][-1])
        assert run["metadata"]["model"] == "gpt-5"
    summary = _json(out / "evaluation_summary.json")
    theirs = recorded["evaluation_summary"]
    assert set(summary) == set(theirs)
    for key in ("LLM", "Accuracy (%)", "Recall (%)", "avg_tool_stats", "Calibration Error (%)",
                "Link"):  # fmt: skip
        assert summary[key] == theirs[key], key
    assert (
        sorted(summary["per_query_metrics"], key=lambda r: r["query_id"])
        == theirs["per_query_metrics"]
    )
    assert summary["Retriever"] == "unknown (BrowseComp-Plus run files do not state it)"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", summary["Evaluation Date"])
    # Their own figures on their own files are the same as on our export of them.
    own = _json(BCP / "expected" / "openai.json")["evaluation_summary"]
    assert {k: own[k] for k in ("Accuracy (%)", "Recall (%)", "avg_tool_stats")} == {
        k: theirs[k] for k in ("Accuracy (%)", "Recall (%)", "avg_tool_stats")
    }
    benchmark = load_benchmark(load_config(config).benchmark)
    assert len(benchmark.queries) == 10
