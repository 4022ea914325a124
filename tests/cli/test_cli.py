"""The command line, run as a user runs it: a subprocess with its own JVM."""

import os
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import GOLDEN

# Imported at collection, while sys.stderr is pytest's session stream: Progress binds its
# default stream at import, and a test's capsys stream is closed after that test, so a
# session fixture (finished_run) built later under another test would write to a closed file.
import piserini_ray.progress  # noqa: F401


def _cli(
    *args: str, home: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PISERINI_RAY_HOME": str(home)} | (env or {})
    done = subprocess.run(
        [sys.executable, "-m", "piserini_ray.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert_no_native_crash(done.stdout + done.stderr)
    return done


#: What a native crash prints (ours, or a Ray worker's forwarded to the driver's output).
NATIVE_CRASH = ("Fatal Python error", "terminate called", "Segmentation fault", "core dumped")


def assert_no_native_crash(output: str) -> None:
    """Every command ends cleanly: no process of its own, nor a Ray worker it started, aborts
    (a run used to end with its index server's abort, whatever its results)."""
    crashes = [line for line in output.splitlines() if any(c in line for c in NATIVE_CRASH)]
    assert not crashes, "a native crash in the command's output:\n" + "\n".join(crashes)


def test_search_and_read_print_what_the_agent_sees(sample_index: Path, tmp_path: Path) -> None:
    root = str(sample_index.parent)
    out = _cli(
        "search",
        "Journal of Psychotherapy Integration publisher",
        "--index-root",
        root,
        home=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == (GOLDEN / "search.txt").read_text() + "\n"
    out = _cli("read", "msq-7976b1e35e0a", "--index-root", root, home=tmp_path)
    assert out.stdout == (GOLDEN / "read_document.txt").read_text() + "\n"
    out = _cli("read", "no-such-doc", "--index-root", root, home=tmp_path)
    assert out.returncode == 1 and "Error: unknown docid 'no-such-doc'" in out.stdout


def test_run_is_the_agent_over_the_slice_and_resumes(tmp_path: Path) -> None:
    config = tmp_path / "five.yaml"
    config.write_text("slice:\n  sample: 5\n  seed: 3\n")
    run_dir = tmp_path / "run"
    out = _cli("run", "--config", str(config), "--run-dir", str(run_dir), home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "building the index of musique-sample" in out.stderr
    assert "queries: 5 (5 run now); completed: 5" in out.stdout
    assert (
        "cached ratio" in out.stdout
        and "| offline/heuristic | offline/exact-match-judge | 5 |" in out.stdout
    )
    assert (run_dir / "report.md").exists() and (run_dir / "summary.json").exists()
    assert (
        len(
            (run_dir / "judgements" / "offline_exact-match-judge-0111b50a.jsonl")
            .read_bytes()
            .splitlines()
        )
        == 5
    )
    records = (run_dir / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert len(records) == 5
    # Simulate a crash mid-write: the last record is torn. Resuming re-runs exactly that one.
    (run_dir / "records.jsonl").write_bytes(b"".join(records[:4]) + records[4][:50])
    out = _cli("resume", str(run_dir), home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "last line was torn" in out.stderr and "4 already recorded, 1 to run" in out.stderr
    assert "queries: 5 (1 run now)" in out.stdout
    ids = [
        orjson.loads(line)["query_id"]
        for line in (run_dir / "records.jsonl").read_bytes().splitlines()
    ]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 5
    again = _cli("run", "--config", str(config), "--run-dir", str(run_dir), home=tmp_path)
    assert "5 already recorded, 0 to run" in again.stderr and "building" not in again.stderr


def test_ask_prints_the_trajectory(sample_index: Path, tmp_path: Path) -> None:
    root = str(sample_index.parent)
    out = _cli("ask", "--query-id", "2hop__150763_14904", "--index-root", root, home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Question: Who was the first president" in out.stdout
    assert "calls search" in out.stdout and "calls read_document" in out.stdout
    assert "Exact Answer:" in out.stdout and "status: completed" in out.stdout
    assert "gold answer: 'G. Stanley Hall'" in out.stdout
    free = _cli(
        "ask",
        "Which journal covers psychotherapy integration?",
        "--index-root",
        root,
        home=tmp_path,
    )
    assert free.returncode == 0 and "status: completed" in free.stdout


def test_offline_provider_command_serves_models(tmp_path: Path) -> None:
    env = os.environ | {"PISERINI_RAY_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "piserini_ray.cli", "offline-provider", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = ""
        while proc.stdout is not None and "listening on" not in line:
            line = proc.stdout.readline()
            assert line, "the provider exited before listening"
        base_url = line.split("listening on", 1)[1].strip()
        models = httpx.get(f"{base_url}/models", timeout=10).json()
        names = {m["id"] for m in models["data"]}
        assert {"offline/heuristic", "offline/exact-match-judge"} <= names
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("benchmark:\n  source: jsonl\n")
    out = _cli("index", "--config", str(config), home=tmp_path)
    assert out.returncode == 2
    assert "needs benchmark.queries and benchmark.corpus" in out.stderr


# ---------------------------------------------------------------- clear errors, exit status 2


def test_an_unknown_query_id_is_a_clear_error(capsys, index_root: Path) -> None:
    from piserini_ray.cli import main

    status = main(["ask", "--query-id", "no-such-query", "--index-root", str(index_root)])
    err = capsys.readouterr().err
    assert status == 2 and "has no query 'no-such-query'" in err and "Traceback" not in err


def test_a_config_that_is_not_utf8_names_the_file_and_line(capsys, tmp_path: Path) -> None:
    from piserini_ray.cli import main

    config = tmp_path / "latin1.yaml"
    config.write_bytes("slice:\n  sample: 5\n# café\n".encode("latin-1"))
    status = main(["index", "--config", str(config)])
    err = capsys.readouterr().err
    assert status == 2 and f"{config}:3: not UTF-8 text" in err and "save the file as UTF-8" in err


def test_an_error_of_the_llm_client_exits_2(capsys, monkeypatch) -> None:
    from piserini_ray import cli
    from piserini_ray.cli import retrieval
    from piserini_ray.llm.failures import Failure, FailureKind, RetryError

    def fails(_args: object) -> int:
        raise RetryError(Failure(FailureKind.PERMANENT, "AuthenticationError: no"), 1)

    monkeypatch.setattr(retrieval, "cmd_index", fails)
    status = cli.main(["index"])
    assert status == 2 and "permanent after 1 attempt(s)" in capsys.readouterr().err


def test_the_browsecomp_plus_index_is_built_from_the_corpus_alone(tmp_path: Path) -> None:
    """A node builds the index before the canary is filled in (cluster.yaml's setup step): the
    shipped config's placeholder canary and absent query file do not matter to `index`; an
    absent corpus is an error naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    config = Path(__file__).resolve().parents[2] / "configs" / "browsecomp-plus.yaml"
    env_home = {"HOME": str(tmp_path)}  # the config's `~/piserini_ray_data/...` paths
    corpus = tmp_path / "piserini_ray_data" / "browsecomp-plus" / "corpus.parquet"
    missing = _cli("index", "--config", str(config), home=tmp_path / "home", env=env_home)
    assert missing.returncode == 2 and f"{corpus}: corpus file does not exist" in missing.stderr
    corpus.parent.mkdir(parents=True)
    docs = [{"docid": str(i), "text": f"document {i} about Lucene", "url": ""} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(docs), corpus)
    out = _cli("index", "--config", str(config), home=tmp_path / "home", env=env_home)
    assert out.returncode == 0, out.stderr
    assert "3 documents, corpus browsecomp-plus:corpus.parquet" in out.stdout


def test_a_second_judge_shows_kappa_and_compare_prints_the_paired_table(
    capsys, sample_index: Path, index_root: Path, tmp_path: Path
) -> None:
    """Two offline runs (the heuristic and its long-horizon variant) on the same 30 queries,
    the first judged again by the lenient judge: its report shows both judges' agreement, and
    `compare` prints the paired table of the two runs."""
    from piserini_ray.cli import main
    from piserini_ray.store import manifest_config

    runs = {}
    for model in ("offline/heuristic", "offline/long-horizon"):
        config = tmp_path / f"{model.split('/')[1]}.yaml"
        config.write_text(f"slice: {{sample: 30}}\nmodel: {{name: {model}}}\n")
        runs[model] = tmp_path / model.split("/")[1]
        args = ["run", "--config", str(config), "--run-dir", str(runs[model])]
        assert main([*args, "--engine", "local", "--index-root", str(index_root)]) == 0
    first = runs["offline/heuristic"]
    assert main(["judge", str(first), "--judge", "offline/lenient-judge"]) == 0
    summary = orjson.loads((first / "summary.json").read_bytes())
    (pair,) = summary["judge_agreement"]
    assert (pair["first"], pair["second"]) == ("offline/exact-match-judge", "offline/lenient-judge")
    assert pair["queries"] == 30 and pair["kappa"] is not None
    (verdicts,) = (first / "judgements").glob("offline_lenient-judge*.jsonl")
    assert verdicts.read_text().count("\n") == 30
    assert "### Judge agreement" in (first / "report.md").read_text()
    assert summary["judge"] == "offline/exact-match-judge"  # the headline keeps the run's judge
    capsys.readouterr()
    out_dir = tmp_path / "compare"
    assert (
        main(["compare", str(first), str(runs["offline/long-horizon"]), "--out", str(out_dir)]) == 0
    )
    printed = capsys.readouterr().out
    assert (
        "## Paired comparison" in printed and f"| {runs['offline/long-horizon']} | 30 |" in printed
    )
    (comparison,) = orjson.loads((out_dir / "compare.json").read_bytes())
    assert comparison["queries"] == 30
    # ... with the power of the comparison at the observed discordance (metrics.power).
    assert f"{runs['offline/long-horizon']}: power (exact McNemar, two-sided, α = 0.05" in printed
    assert comparison["power"]["queries"] == 30 and len(comparison["power"]["needed"]) == 3
    assert comparison["wins"] + comparison["losses"] + comparison["ties"] == 30
    assert main(["compare", str(first)]) == 2  # one run is nothing to compare
    # A sweep's combined report holds the same comparison against its reference run.
    from piserini_ray.pipeline import report_runs

    combined = tmp_path / "combined"
    pairs = [(manifest_config(d), d) for d in runs.values()]
    report_runs(pairs, lambda _m: None, out=combined, reference=first)
    assert f"| {runs['offline/long-horizon']} | 30 |" in (combined / "report.md").read_text()


@pytest.mark.slow  # the dense sample index
def test_retrieval_eval_prints_every_backend_side_by_side(
    capsys, sample, searcher, dense_sample: Path, index_root: Path, tmp_path: Path
) -> None:
    from piserini_ray.analysis.bm25_grid import score_rankings
    from piserini_ray.cli import main

    out = tmp_path / "eval"
    assert main(["retrieval-eval", "--index-root", str(index_root), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["bm25", "dense", "hybrid", "rerank"]
    scores = orjson.loads((out / "retrieval_eval.json").read_bytes())
    assert list(scores) == ["bm25", "dense", "hybrid", "rerank"]
    # The BM25 column is the plain searcher's rankings scored independently of the command.
    rankings = {q.query_id: [d for d, _ in searcher.search_docids(q.query)] for q in sample.queries}
    assert scores["bm25"] == score_rankings(
        rankings, sample, depths=(5, 10, 20, 50, 100, 200, 500, 1000)
    )
    ndcg = next(line for line in lines if line.strip().startswith("ndcg@10")).split()
    assert ndcg[1:] == [f"{100 * scores[b]['ndcg@10']:.2f}%" for b in scores]
    trec = (out / "run.dense.trec").read_text().splitlines()
    assert len(trec) == 1000 * len(sample.queries) and trec[0].endswith(" dense")


def test_power_sizes_a_run_from_a_pilot(capsys, finished_run: tuple[Path, object]) -> None:
    """`power RUN --effect ...`: the pilot's accuracy under its judge, the discordance assumed
    2p(1-p) (stated), and the queries each effect needs, as metrics.power computes them."""
    from piserini_ray.cli import main
    from piserini_ray.metrics.power import queries_needed
    from piserini_ray.pipeline import run_facts

    run_dir, _ = finished_run
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    capsys.readouterr()
    facts = run_facts(run_dir, lambda _m: None).facts
    p = sum(f.verdict == "judged" and bool(f.correct) for f in facts) / len(facts)
    # The offline pilot gets nothing right: 2p(1-p) = 0 would say no run ever disagrees with
    # it, so the discordance is unknown and asked for (a mixed pilot: tests/reports/
    # test_power_pilot.py).
    assert p == 0.0
    assert main(["power", str(run_dir), "--effect", "0.02", "--effect", "0.05"]) == 2
    printed = capsys.readouterr().out
    assert "## Power from a pilot run" in printed and f"Pilot: {run_dir}" in printed
    assert f"{summary['queries']} queries" in printed and "discordance is unknown" in printed
    for row in ("| 2 | ", "| 5 | "):
        assert f"{row}unknown (pass --discordance) |" in printed
    assert main(["power", str(run_dir), "--effect", "0.05", "--discordance", "0.2"]) == 0
    assert f"| 5 | {queries_needed(0.05, 0.2):,} |" in capsys.readouterr().out
    assert main(["power", str(run_dir), "--effect", "5"]) == 2  # points, not a fraction


def test_the_cli_writes_no_file_itself_and_no_module_of_it_is_over_700_lines() -> None:
    """The command line parses, calls and prints: every file it leaves is written by the store
    or a named writer (`reports/writers.py`, `formats/exporter.py`), never by
    `piserini_ray/cli/`."""
    import re

    import piserini_ray.cli

    package = Path(piserini_ray.cli.__file__).parent
    writes = re.compile(
        r"\.write_text\(|\.write_bytes\(|\.mkdir\(|\bopen\([^)]*['\"][wax]b?\+?['\"]|os\.open\("
    )
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(package.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if writes.search(line)
    ]
    assert not found, "the CLI writes files itself:\n" + "\n".join(found)
    long = [p.name for p in package.glob("*.py") if len(p.read_text().splitlines()) > 700]
    assert not long, f"modules over 700 lines: {long}"


def test_python_m_and_the_script_entry_point_reach_the_same_parser() -> None:
    from importlib.metadata import entry_points

    from piserini_ray.cli import build_parser, entry

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "piserini-ray"]
    assert script.value == "piserini_ray.cli:entry" and script.load() is entry
    done = subprocess.run(
        [sys.executable, "-m", "piserini_ray.cli", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    for command in ("run", "judge", "report", "export"):
        assert command in done.stdout and command in build_parser().format_help()


def test_a_command_process_exits_with_mains_status_and_its_objects_frozen_out_of_the_collector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Python's collections at exit walked every object a command left (2 s after the report
    # was printed): `entry` freezes them first, then exits with main's status.
    import gc

    from piserini_ray.cli import entry

    assert gc.get_freeze_count() == 0
    try:
        with pytest.raises(SystemExit) as exited:
            entry(["pricing", "--no-such-option"])
        assert exited.value.code == 2  # argparse's own exit, before anything ran: not frozen
        assert gc.get_freeze_count() == 0
        with pytest.raises(SystemExit) as exited:
            entry(["report", str(tmp_path / "no-such-run")])
        assert exited.value.code == 2 and "not a run directory" in capsys.readouterr().err
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
