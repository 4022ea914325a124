"""`piserini-ray import` (issue 24): runs made by other harnesses become run directories that
`judge` and `report` read as our own. Our exports import back with the same figures; a file of
the BrowseComp-Plus format without our extension reports what it lacks as n/a, never 0; a bad
file stops the import before anything is written; importing again never duplicates."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest

from piserini_ray.cli import main
from piserini_ray.config import load_config
from piserini_ray.data import load_benchmark


@pytest.fixture(scope="module")
def original(
    tmp_path_factory: pytest.TempPathFactory, index_root: Path, sample_index: Path
) -> tuple[Path, Path]:
    """An offline run of 6 sample queries, judged and reported: `(config file, run dir)`. The
    offline heuristic rarely answers a sample question right, so two of its answers are made
    right (their Exact Answer line set to the gold answer) and the run is judged again: an
    accuracy of 0 would prove nothing."""
    folder = tmp_path_factory.mktemp("import")
    config = folder / "run.yaml"
    config.write_text(f"slice: {{sample: 6, seed: 3}}\nretrieval: {{index_root: '{index_root}'}}\n")
    run_dir = folder / "original"
    status = main(["run", "--engine", "local", "--concurrency", "3", "--config", str(config),
                   "--run-dir", str(run_dir)])  # fmt: skip
    assert status == 0
    benchmark = load_benchmark(load_config(config).benchmark)
    records = sorted(_records(run_dir).values(), key=lambda r: r["query_id"])
    for record in records[:2]:
        gold = benchmark.query(record["query_id"]).answer
        answer = re.sub(r"(?m)^Exact Answer: .*$", f"Exact Answer: {gold}", record["final_answer"])
        assert answer != record["final_answer"]
        record.update(final_answer=answer, exact_answer=gold)
    (run_dir / "records.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    for path in (run_dir / "judgements").glob("*.jsonl"):
        path.unlink()
    assert main(["judge", str(run_dir)]) == 0
    assert _json(run_dir / "summary.json")["accuracy"]["value"] == pytest.approx(2 / 6)
    return config, run_dir


def _json(path: Path) -> dict:
    return orjson.loads(path.read_bytes())


def _records(run_dir: Path) -> dict[str, dict]:
    rows = [orjson.loads(line) for line in (run_dir / "records.jsonl").read_bytes().splitlines()]
    by_id = {r["query_id"]: r for r in rows}
    assert len(by_id) == len(rows), "a query recorded twice"
    return by_id


def _verdicts(run_dir: Path) -> dict[str, bool]:
    (path,) = (run_dir / "judgements").glob("*.jsonl")
    return {
        row["query_id"]: row["correct"] for row in map(orjson.loads, path.read_bytes().splitlines())
    }


def _import(folder: Path, fmt: str, config: Path, run_dir: Path) -> int:
    return main(["import", str(folder), "--format", fmt, "--config", str(config),
                 "--run-dir", str(run_dir)])  # fmt: skip


def _round_trip(original: tuple[Path, Path], tmp_path: Path, fmt: str) -> tuple[dict, dict]:
    config, run_dir = original
    out, imported = tmp_path / "export", tmp_path / "imported"
    assert main(["export", str(run_dir), "--format", fmt, "--out", str(out)]) == 0
    assert _import(out, fmt, config, imported) == 0
    assert main(["judge", str(imported)]) == 0
    assert _verdicts(imported) == _verdicts(run_dir)  # the same answers, the same verdicts
    return _json(run_dir / "summary.json"), _json(imported / "summary.json")


def _same_figures(ours: dict, back: dict) -> None:
    assert back["queries"] == ours["queries"] == 6
    assert back["statuses"] == ours["statuses"]
    assert back["accuracy"] == ours["accuracy"]
    for kind in ("evidence", "gold"):
        surfaced = ours["recall"]["surfaced"][kind]["macro"]
        assert surfaced["value"] is not None and surfaced["queries"] > 0
        assert back["recall"]["surfaced"][kind] == ours["recall"]["surfaced"][kind]
    # Every document set comes back (nothing marked unavailable), and so do the tokens.
    assert back["recall"] == ours["recall"]
    assert back["tokens_total"]["input_tokens"] == ours["tokens_total"]["input_tokens"] > 0
    assert back["tokens_total"]["output_tokens"] == ours["tokens_total"]["output_tokens"] > 0
    assert back["cost_usd"] == ours["cost_usd"] == 0.0  # offline models are priced at 0
    # What neither format holds: the rankings (depth curve) and the budget clock.
    assert any(v is not None for v in ours["depth_curve"]["evidence"].values())
    assert all(v is None for v in back["depth_curve"]["evidence"].values())
    assert ours["budget"] is not None and back["budget"] is None
    assert set(back["unavailable"]) == {"depth_curve", "budget"} and ours["unavailable"] == {}


def test_a_browsecomp_plus_export_imports_back_with_the_same_figures(
    original: tuple[Path, Path], tmp_path: Path
) -> None:
    ours, back = _round_trip(original, tmp_path, "browsecomp-plus")
    _same_figures(ours, back)
    records = _records(tmp_path / "imported")
    for qid, record in records.items():
        assert record["imported"]["format"] == "browsecomp-plus"
        assert record["imported"]["file"] == f"run_{qid}.json"  # as their clients name them
        assert record["imported"]["unavailable"] == ["trajectory", "rankings", "timing", "wall"]


def test_a_pi_serini_export_imports_back_with_the_same_figures(
    original: tuple[Path, Path], tmp_path: Path
) -> None:
    ours, back = _round_trip(original, tmp_path, "pi-serini")
    _same_figures(ours, back)
    first, records = _records(original[1]), _records(tmp_path / "imported")
    assert set(records) == set(first)
    for qid, record in records.items():
        assert record["wall_seconds"] == first[qid]["wall_seconds"] > 0  # stats.elapsed_seconds
        assert record["imported"]["unavailable"] == ["trajectory", "rankings", "timing"]
        for name in ("surfaced", "previewed", "opened", "cited", "behavior"):
            assert record[name] == first[qid][name]


def _macro(sets: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> float:
    """Macro recall over the queries with relevant documents, computed here on its own."""
    shares = []
    for qid, docs in sets.items():
        relevant = {d for d, rel in qrels.get(qid, {}).items() if rel > 0}
        if relevant:
            shares.append(len(relevant & set(docs)) / len(relevant))
    return sum(shares) / len(shares)


def test_their_own_files_report_what_they_lack_as_n_a_never_zero(
    original: tuple[Path, Path], tmp_path: Path
) -> None:
    """Files as their harness writes them: no document sets but `retrieved_docids`, no usage,
    a status of their own (`incomplete`, an OpenAI response status)."""
    config, run_dir = original
    first = _records(run_dir)
    folder = tmp_path / "theirs"
    folder.mkdir()
    odd = sorted(first)[0]  # answered right: its verdict turns wrong as a failure
    for n, (qid, record) in enumerate(sorted(first.items())):
        run = {
            "metadata": {"model": "their-model", "output_dir": "runs/x"},
            "query_id": qid,
            "tool_call_counts": record["tool_call_counts"],
            "status": "incomplete" if qid == odd else record["status"],
            "retrieved_docids": list(dict.fromkeys(record["previewed"] + record["opened"])),
            "result": [
                {"type": "reasoning", "tool_name": None, "arguments": None, "output": "hm"},
                # A citation of no document of the corpus: dropped, as the agent drops it.
                {"type": "output_text", "output": f"{record['final_answer']}\nSee [no-such-doc]."},
            ],
        }
        (folder / f"run_2025010{n}T000000Z.json").write_bytes(orjson.dumps(run))
    imported = tmp_path / "imported"
    assert _import(folder, "browsecomp-plus", config, imported) == 0
    assert main(["judge", str(imported)]) == 0
    ours, back = _json(run_dir / "summary.json"), _json(imported / "summary.json")

    for name in ("previewed", "opened", "behavior"):
        for kind in ("evidence", "gold"):
            figures = back["recall"][name][kind]
            none = {"value": None, "ci95": None, "queries": 0}
            assert figures["macro"] == figures["micro"] == none
            assert ours["recall"][name][kind]["macro"]["value"] is not None
        assert back["unavailable"][f"recall.{name}"] == "not in the browsecomp-plus format"
    assert back["cost_usd"] is None and back["tokens_total"] is None and ours["cost_usd"] == 0.0
    assert back["unavailable"]["tokens"] == back["unavailable"]["cost"]
    # Surfaced is what their retriever returned: here our previewed and opened documents.
    benchmark = load_benchmark(load_config(config).benchmark)
    retrieved = {q: list(dict.fromkeys(r["previewed"] + r["opened"])) for q, r in first.items()}
    for kind, qrels in (("evidence", benchmark.evidence), ("gold", benchmark.gold)):
        value = back["recall"]["surfaced"][kind]["macro"]["value"]
        assert value == pytest.approx(_macro(retrieved, qrels))
    # Citations parse from the answer against the corpus, as the agent's did (the odd one out
    # is a failure now: its answer no longer counts).
    records = _records(imported)
    for qid, record in records.items():
        assert record["model"] == "their-model"
        assert record["cited"] == ([] if qid == odd else first[qid]["cited"])
    assert records[odd]["status"] == "failed" and records[odd]["error"] == "incomplete"
    verdicts, theirs = _verdicts(run_dir), _verdicts(imported)
    assert verdicts[odd] is True and sum(verdicts.values()) == 2
    assert theirs == {q: c and q != odd for q, c in verdicts.items()}
    assert back["accuracy"]["value"] == pytest.approx(1 / 6)

    report = (imported / "report.md").read_text()
    assert (
        f"Imported from browsecomp-plus ({folder}): not in that format, shown n/a, never 0: "
        in report
    )
    line = next(x for x in report.splitlines() if x.startswith("Imported from"))
    for figure in ("recall.previewed", "recall.opened", "recall.behavior", "tokens", "cost"):
        assert figure in line
    assert "Tokens: n/a (not in the imported format)" in report
    row = next(x for x in report.splitlines() if x.startswith(f"| {imported}"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # run, model, judge, queries, accuracy, surfaced, previewed, behavior, CE, CE, cost
    assert cells[6] == cells[7] == cells[10] == "n/a" and cells[5] != "n/a"
    assert "| previewed | n/a | n/a | n/a | n/a |" in report


def test_a_bad_file_is_named_with_its_field_and_nothing_is_written(
    original: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = original
    out = tmp_path / "export"
    assert main(["export", str(run_dir), "--format", "browsecomp-plus", "--out", str(out)]) == 0
    files = sorted(out.glob("run_*.json"))
    broken = _json(files[-1])
    del broken["result"]
    files[-1].write_bytes(orjson.dumps(broken))
    imported = tmp_path / "imported"
    capsys.readouterr()
    assert _import(out, "browsecomp-plus", config, imported) == 2
    err = capsys.readouterr().err
    assert (
        f"run file {files[-1]}: field 'result' is missing (a list of items, the last one the "
        "output_text answer)" in err
    )
    assert not (imported / "records.jsonl").exists()  # the good files were not imported either

    # A query the benchmark does not hold is skipped, as their evaluator skips a query without
    # ground truth, and named; a folder holding nothing else is the wrong benchmark: refused.
    broken["result"] = [{"type": "output_text", "output": "Exact Answer: x"}]
    broken["query_id"] = "no-such-query"
    files[-1].write_bytes(orjson.dumps(broken))
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(files[-1], alone / files[-1].name)
    assert _import(alone, "browsecomp-plus", config, imported) == 2
    err = capsys.readouterr().err
    assert "none of its 1 runs is a query of benchmark" in err and files[-1].name in err
    assert not (imported / "records.jsonl").exists()
    assert _import(out, "browsecomp-plus", config, imported) == 0
    printed = capsys.readouterr().out
    assert f"read {len(files)} file(s); 1 run(s) skipped" in printed
    assert f"skipped {files[-1].name}: query_id 'no-such-query' is not a query of benchmark" in (
        printed
    )
    assert len(_records(imported)) == len(files) - 1


def test_importing_again_skips_what_the_run_holds(
    original: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = original
    out, half = tmp_path / "export", tmp_path / "half"
    assert main(["export", str(run_dir), "--format", "pi-serini", "--out", str(out)]) == 0
    shutil.copytree(out, half)
    runs = sorted(half.glob("[0-9]*.json"))
    for path in runs[3:]:
        path.unlink()
    imported = tmp_path / "imported"
    capsys.readouterr()
    assert _import(half, "pi-serini", config, imported) == 0
    assert "imported 3 queries" in capsys.readouterr().out
    assert _import(out, "pi-serini", config, imported) == 0
    captured = capsys.readouterr()
    assert "imported 3 queries" in captured.out and "skipped 3 already recorded" in captured.out
    assert "3 of the 6 queries" in captured.err and "skipped, not imported twice" in captured.err
    assert set(_records(imported)) == set(_records(run_dir))  # each once


def test_a_pi_serini_run_folder_of_their_harness_imports_without_usage(
    original: tuple[Path, Path], tmp_path: Path
) -> None:
    """A folder as `run_pi_benchmark.ts` writes it: `<query id>.json` run files without usage,
    their stats, a failed query whose last item is the agent's stderr, and files that are not
    run files (`run_setup.json`, the manifest snapshot, `raw-events/`)."""
    config, run_dir = original
    first = _records(run_dir)
    folder = tmp_path / "pi-run"
    (folder / "raw-events").mkdir(parents=True)
    (folder / "raw-events" / "x.jsonl").write_text("{}\n")
    for name in ("run_setup.json", "benchmark_manifest_snapshot.json"):
        (folder / name).write_text('{"model": "x"}')
    failed = sorted(first)[0]  # answered right: wrong once it failed
    for qid, r in first.items():
        answer = {"type": "output_text", "tool_name": None, "arguments": None,
                  "output": r["final_answer"]}  # fmt: skip
        stderr = {**answer, "output": "pi stderr:\nprovider error 500"}
        run = {
            "metadata": {"benchmark_id": "benchmark-template", "model": "pi/their-model"},
            "query_id": qid,
            "tool_call_counts": r["tool_call_counts"],
            "status": "failed" if qid == failed else "completed",
            "completion_source": "assistant_text",
            "surfaced_docids": r["surfaced"],
            "previewed_docids": r["previewed"],
            "agent_docids": r["behavior"],
            "opened_docids": r["opened"],
            "cited_docids": r["cited"],
            "stats": {"elapsed_seconds": 12.5, "assistant_turns": 4, "timed_out": False},
            "result": [answer, stderr] if qid == failed else [answer],
        }
        (folder / f"{qid}.json").write_bytes(orjson.dumps(run))
    imported = tmp_path / "imported"
    assert _import(folder, "pi-serini", config, imported) == 0
    assert main(["judge", str(imported)]) == 0
    ours, back = _json(run_dir / "summary.json"), _json(imported / "summary.json")
    assert back["queries"] == 6 and back["statuses"] == {"completed": 5, "failed": 1}
    assert back["recall"] == ours["recall"]  # every tier as their harness listed it
    assert back["cost_usd"] is None and back["tokens_total"] is None
    assert set(back["unavailable"]) == {"tokens", "cost", "depth_curve", "budget"}
    verdicts = _verdicts(run_dir)
    assert verdicts[failed] is True
    assert _verdicts(imported) == {q: c and q != failed for q, c in verdicts.items()}
    records = _records(imported)
    assert records[failed]["error"] == "pi stderr:\nprovider error 500"
    assert records[failed]["final_answer"] is None
    assert {(r["wall_seconds"], r["turns"], r["model"]) for r in records.values()} == {
        (12.5, 4, "pi/their-model")
    }
    assert records[failed]["imported"]["unavailable"] == [
        "usage", "trajectory", "rankings", "timing"
    ]  # fmt: skip


def _their_files_without_usage(run_dir: Path, folder: Path) -> None:
    """BrowseComp-Plus run files of `run_dir`'s answers as their clients write them: no usage,
    no document sets but `retrieved_docids`."""
    folder.mkdir(parents=True)
    for n, (qid, record) in enumerate(sorted(_records(run_dir).items())):
        run = {
            "metadata": {"model": "their-model"},
            "query_id": qid,
            "tool_call_counts": record["tool_call_counts"],
            "status": record["status"],
            "retrieved_docids": list(dict.fromkeys(record["previewed"] + record["opened"])),
            "result": [{"type": "output_text", "output": record["final_answer"]}],
        }
        (folder / f"run_2025010{n}T000000Z.json").write_bytes(orjson.dumps(run))


@pytest.fixture(scope="module")
def without_usage(original: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The original run's answers imported from BrowseComp-Plus files without usage, judged."""
    config, run_dir = original
    folder = tmp_path_factory.mktemp("no-usage")
    _their_files_without_usage(run_dir, folder / "theirs")
    imported = folder / "imported"
    assert _import(folder / "theirs", "browsecomp-plus", config, imported) == 0
    assert main(["judge", "--engine", "local", str(imported)]) == 0
    assert _json(imported / "summary.json")["cost_usd"] is None
    return imported


def _paired_row(table: str, run: Path) -> list[str]:
    row = next(x for x in table.splitlines() if x.startswith(f"| {run} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_compare_shows_an_imported_runs_unknown_cost_as_n_a_never_zero(
    original: tuple[Path, Path], without_usage: Path, tmp_path: Path
) -> None:
    """`compare` against a run without usage: the cost difference is n/a (both runs are priced
    at 0 offline, so a usage read as zero would print +0.0000), and so is the cut-short count
    when the reference holds no budget clock; the rest of the comparison stands."""
    _, run_dir = original
    imported = without_usage.absolute()
    out = tmp_path / "compare"
    assert main(["compare", str(run_dir), str(without_usage), "--out", str(out)]) == 0
    (c,) = _json(out / "compare.json")
    assert c["queries"] == 6 and c["accuracy"]["difference"] == 0.0  # the same answers
    assert c["cost_per_query"] is None
    assert c["cut_short"] == 0 and c["cut_short_gained"] == 0  # our reference has its clock
    assert set(c["unavailable"]) == {"cost_per_query"}
    assert "usage" in c["unavailable"]["cost_per_query"]
    assert "browsecomp-plus" in c["unavailable"]["cost_per_query"]
    table = (out / "compare.md").read_text()
    # run, queries, accuracy, Δ accuracy, McNemar, wins/losses/ties, Δ recall, Δ cost, cut
    cells = _paired_row(table, imported)
    assert cells[7] == "n/a" and "0.0000" not in table
    assert cells[8] == "0 -> 0" and cells[2] == "33.3 -> 33.3"
    assert "Δ cost n/a, never 0: no usage in the browsecomp-plus format of the run" in table

    # The imported run as the reference: whether it steered is unknown too.
    back = tmp_path / "back"
    assert main(["compare", str(without_usage), str(run_dir), "--out", str(back)]) == 0
    (c,) = _json(back / "compare.json")
    assert c["cost_per_query"] is None and c["cut_short"] is None
    assert c["cut_short_gained"] is None
    assert set(c["unavailable"]) == {"cost_per_query", "cut_short"}
    cells = _paired_row((back / "compare.md").read_text(), run_dir.absolute())
    assert cells[7] == cells[8] == "n/a"

    # Runs of our own keep their figures: a cost difference of 0 is a measured 0.
    ours = tmp_path / "ours"
    assert main(["compare", str(run_dir), str(run_dir), "--out", str(ours)]) == 0
    (c,) = _json(ours / "compare.json")
    assert c["cost_per_query"]["difference"] == 0.0 and c["unavailable"] == {}
    assert c["cut_short"] is not None


def _viewer_rows(run_dir: Path) -> dict[str, dict]:
    text = (run_dir / "viewer" / "index.js").read_text()
    rows = orjson.loads(text.removeprefix("window.piseriniRows = ").removesuffix(";\n"))
    return {r["id"]: r for r in rows}


def _viewer_query(run_dir: Path, name: str) -> dict:
    text = (run_dir / "viewer" / "q" / name).read_text()
    return orjson.loads(text.removeprefix("window.piseriniQuery(").removesuffix(");\n"))


def test_the_viewer_shows_an_imported_runs_unknown_tokens_and_cost_as_n_a_never_zero(
    original: tuple[Path, Path], without_usage: Path
) -> None:
    _, run_dir = original
    ours, theirs = _viewer_rows(run_dir), _viewer_rows(without_usage)
    assert set(theirs) == set(ours) and len(theirs) == 6
    for qid, row in theirs.items():
        # None in the data (shown n/a by the page), never the empty usage's 0.
        assert row["tokens"] is None and row["cost"] is None
        assert row["wall"] is None and row["steered"] is None and row["turns"] is None
        assert {"tokens", "cost", "wall", "steered", "turns"} <= set(row["unavailable"])
        assert {"recall.previewed", "recall.opened", "recall.behavior"} <= set(row["unavailable"])
        assert "recall.surfaced" not in row["unavailable"]
        # Ours: measured tokens, and a measured cost of 0 (offline models are priced at 0).
        assert ours[qid]["tokens"] > 0 and ours[qid]["cost"] == 0.0
        assert ours[qid]["unavailable"] == [] and ours[qid]["wall"] > 0
        page = _viewer_query(without_usage, row["file"])
        assert page["usage"] is None
        assert set(page["seconds"].values()) == {None}
        assert page["imported"]["format"] == "browsecomp-plus"
        assert "usage" in page["imported"]["unavailable"]
        mine = _viewer_query(run_dir, ours[qid]["file"])
        assert mine["usage"]["input_tokens"] > 0 and mine["imported"] is None
        assert mine["seconds"]["wall"] > 0


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_the_viewer_page_of_an_imported_run_reads_n_a(without_usage: Path, tmp_path: Path) -> None:
    """The page itself (headless Chromium, as tests/reports/test_viewer.py): the table's tokens
    and cost cells and the opened query's tokens, cost and time read n/a."""
    import subprocess
    from urllib.parse import quote

    def dom(url: str) -> str:
        return subprocess.run(
            [
                "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
                "--dump-dom", url,
            ],
            capture_output=True, text=True, timeout=120,
        ).stdout  # fmt: skip

    page = (without_usage / "report.html").as_uri()
    qid = sorted(_viewer_rows(without_usage))[0]
    text = dom(f"{page}#q={quote(qid)}")
    row = re.search(rf'<tr data-query="{re.escape(qid)}">(.*?)</tr>', text)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row.group(1))
    # query, status, correct, confidence, tool calls, turns, tokens, cost, seconds, steered,
    # surfaced, previewed, opened, cited, behavior
    assert cells[5:10] == ["n/a"] * 5
    assert cells[11] == cells[12] == cells[14] == "n/a" and cells[10] != "n/a"
    assert f'data-query="{qid}"' in text
    assert "<dt>tokens</dt><dd>n/a</dd>" in text and "<dt>cost $</dt><dd>n/a</dd>" in text
    assert "<dd>n/a wall, n/a charged, n/a waiting</dd>" in text
    assert "n/a: not in the browsecomp-plus format" in text


def test_reporting_an_imported_run_draws_no_empty_legend(
    original: tuple[Path, Path], without_usage: Path, tmp_path: Path
) -> None:
    """An imported run has no depth curve and no budget analysis: its plots draw no line, so
    they have no legend, and matplotlib has nothing to warn of (alone or beside our run)."""
    import warnings

    _, run_dir = original
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["report", str(without_usage)]) == 0
        assert main(["report", str(run_dir), str(without_usage), "--out", str(tmp_path)]) == 0
    legend = [str(w.message) for w in caught if "legend" in str(w.message).lower()]
    assert legend == []
    for folder in (without_usage, tmp_path):
        for name in ("depth", "answer_times", "tools"):
            assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
