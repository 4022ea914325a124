import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from piserini_ray.config import RunConfig, load_config
from piserini_ray.records import Judgement, QueryRecord, RankingLog, now_iso
from piserini_ray.store import RunStore, RunStoreError


def _record(store: RunStore, query_id: str) -> QueryRecord:
    return QueryRecord(
        run_id=store.run_id, config_hash=store.config_hash, query_id=query_id, model="m",
        status="completed", started_at=now_iso(), finished_at=now_iso(),
    )  # fmt: skip


def test_manifest_records_and_reopen(tmp_path: Path) -> None:
    config = RunConfig()
    with RunStore(tmp_path / "run", config) as store:
        store.append(_record(store, "q1"))
        store.append(_record(store, "q2"))
        manifest = store.manifest
    assert manifest.config_hash == config.config_hash()
    assert {"piserini_ray", "pyserini", "litellm", "python"} <= set(manifest.versions)
    with RunStore(tmp_path / "run", config) as store:
        assert store.done() == {"q1", "q2"} and store.run_id == manifest.run_id
        assert [r.query_id for r in store.records()] == ["q1", "q2"]


def test_a_query_is_written_once(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.append(_record(store, "q1"))
        with pytest.raises(RunStoreError, match="q1 already has a record"):
            store.append(_record(store, "q1"))
    with RunStore(tmp_path / "run", RunConfig()) as store, pytest.raises(RunStoreError):
        store.append(_record(store, "q1"))  # also after reopening
    assert (tmp_path / "run" / "records.jsonl").read_text().count("\n") == 1


def test_torn_last_line_is_reported_and_cut(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.append(_record(store, "q1"))
    path = tmp_path / "run" / "records.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + b'{"run_id": "x", "query_id": "q2", "sta')
    messages: list[str] = []
    with RunStore(tmp_path / "run", RunConfig(), log=messages.append) as store:
        assert store.done() == {"q1"}
        assert path.read_bytes() == good
        assert "last line was torn" in messages[0]
        store.append(_record(store, "q2"))  # the torn query runs again and is recorded once
    assert [r.query_id for r in RunStore(tmp_path / "run", RunConfig()).records()] == ["q1", "q2"]


def test_damage_inside_the_file_is_not_silently_dropped(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.append(_record(store, "q1"))
    path = tmp_path / "run" / "records.jsonl"
    path.write_bytes(b"{broken\n" + path.read_bytes())
    with pytest.raises(RunStoreError, match="line 1 is damaged"):
        RunStore(tmp_path / "run", RunConfig())


def test_another_config_is_refused_with_directions(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.append(_record(store, "q1"))
    other = load_config(None, {"agent.budget_seconds": 60})
    with pytest.raises(RunStoreError, match=r"config hash .* `piserini-ray resume"):
        RunStore(tmp_path / "run", other)


def test_a_run_directory_without_records_takes_a_corrected_config(tmp_path: Path) -> None:
    RunStore(tmp_path / "run", RunConfig()).close()  # e.g. stopped by a data error
    other = load_config(None, {"agent.budget_seconds": 60})
    messages: list[str] = []
    with RunStore(tmp_path / "run", other, log=messages.append) as store:
        assert store.manifest.config_hash == other.config_hash()
    assert "holds no record yet" in messages[0]


def test_one_process_at_a_time(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()), pytest.raises(RunStoreError, match="in use"):
        RunStore(tmp_path / "run", RunConfig())


def test_spill_dirs_stay_inside_the_run(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        spill = store.spill_dir("../../etc")
    assert spill.resolve().is_relative_to((tmp_path / "run" / "spill").resolve())


# ---------------------------------------------------------------- crash safety of every JSONL


def _full_record(store: RunStore, query_id: str) -> QueryRecord:
    record = _record(store, query_id)
    record.rankings = [RankingLog(search_id="s1", query=f"about {query_id}", docids=["d1", "d2"])]
    record.spills = {"0001-read_document-d1-1-200.txt": f"the whole text for {query_id}"}
    return record


def _verdict(query_id: str, status: str = "judged") -> Judgement:
    return Judgement(query_id=query_id, judge_model="judge/x", status=status, correct=True)


def cut_offsets(data: bytes, interior: int = 48, seed: int = 0) -> list[int]:
    """Where to cut `data`: every offset within 2 bytes of a line's end, the first and last
    bytes, and `interior` more drawn (seeded) from inside the lines: every kind of cut a crash
    leaves (a whole line, a line torn anywhere, a torn UTF-8 or JSON token) at a fraction of
    the cost of every byte."""
    ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    edges = {o for end in [0, *ends, len(data)] for o in range(end - 2, end + 3)}
    inside = sorted(set(range(len(data) + 1)) - edges)
    drawn = random.Random(seed).sample(inside, min(interior, len(inside)))
    return sorted(o for o in edges | set(drawn) if 0 <= o <= len(data))


def _cut_copies(run: Path, name: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """For the offsets of `cut_offsets` in `run/name`: a copy of the run directory with that
    file cut there (what a crash at that moment of its last write leaves, or worse)."""
    original = (run / name).read_bytes()
    for offset in cut_offsets(original):
        copy = tmp_path / f"cut-{offset}"
        shutil.copytree(run, copy)
        (copy / name).write_bytes(original[:offset])
        yield offset, copy


def test_records_cut_anywhere_resume_whole_and_once(tmp_path: Path) -> None:
    ids = ["q1", "q2", "q3"]
    with RunStore(tmp_path / "run", RunConfig()) as store:
        for qid in ids:
            store.append(_full_record(store, qid))
    original = (tmp_path / "run" / "records.jsonl").read_bytes()
    line_ends = [i + 1 for i, byte in enumerate(original) if byte == ord("\n")]
    for offset, run in _cut_copies(tmp_path / "run", "records.jsonl", tmp_path / "cuts"):
        whole = ids[: sum(1 for end in line_ends if end <= offset)]
        messages: list[str] = []
        with RunStore(run, RunConfig(), log=messages.append) as store:
            assert sorted(store.done()) == whole, offset
            assert bool(messages) == (offset not in [0, *line_ends]), offset  # torn: reported
            for qid in ids:  # the resume: what is missing runs again
                if qid not in store.done():
                    store.append(_full_record(store, qid))
        with RunStore(run, RunConfig()) as store:
            records = store.records(rankings=True)
            assert [r.query_id for r in records] == ids, offset  # each once, in order
            assert all(r.rankings[0].query == f"about {r.query_id}" for r in records)
            assert all(
                (store.spill_dir(qid) / "0001-read_document-d1-1-200.txt").read_text()
                == f"the whole text for {qid}"
                for qid in ids
            )
        assert (run / "records.jsonl").read_bytes().count(b"\n") == len(ids), offset


def test_verdicts_cut_anywhere_are_judged_again_once(tmp_path: Path) -> None:
    from piserini_ray.judging.grader import to_judge

    ids = ["q1", "q2", "q3"]
    with RunStore(tmp_path / "run", RunConfig()) as store:
        for qid in ids:
            store.append(_full_record(store, qid))
            store.append_judgement(_verdict(qid))
        name = str(store.judgements_path("judge/x").relative_to(store.run_dir))
    for offset, run in _cut_copies(tmp_path / "run", name, tmp_path / "cuts"):
        with RunStore(run, RunConfig(), log=lambda _m: None) as store:
            records = store.records()
            for record in to_judge(records, store.judgements("judge/x")):
                store.append_judgement(_verdict(record.query_id))
            verdicts = store.judgements("judge/x")
            lines = store.judgements_path("judge/x").read_bytes().splitlines()
        assert sorted(verdicts) == ids, offset
        assert sorted(orjson.loads(line)["query_id"] for line in lines) == ids, offset


def test_a_judge_failure_is_judged_again_and_the_verdict_wins(tmp_path: Path) -> None:
    from piserini_ray.judging.grader import to_judge

    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.append(_full_record(store, "q1"))
        store.append_judgement(_verdict("q1", "judge_failed"))
        assert [r.query_id for r in to_judge(store.records(), store.judgements("judge/x"))] == [
            "q1"
        ]
        store.append_judgement(_verdict("q1"))
        assert store.judgements("judge/x")["q1"].status == "judged"
        assert to_judge(store.records(), store.judgements("judge/x")) == []


def test_grid_cells_cut_at_every_byte_resume_whole(tmp_path: Path) -> None:
    from piserini_ray.analysis.bm25_grid import CellResult, GridStore

    cells = [CellResult(k1=k1, b=0.5, queries=3, metrics={"map": k1}) for k1 in (0.9, 1.2)]
    grid = GridStore(tmp_path / "grid")
    for cell in cells:
        grid.add(cell)
    original = grid.path.read_bytes()
    for offset in range(len(original) + 1):
        grid.path.write_bytes(original[:offset])
        again = GridStore(tmp_path / "grid", log=lambda _m: None)
        for cell in cells:
            if (cell.k1, cell.b) not in again.done():
                again.add(cell)
        assert grid.path.read_bytes() == original, offset


def test_spill_files_come_with_the_record_and_replace_a_crashed_attempt(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        stale = store.spill_dir("q1") / "0002-search-old.txt"
        stale.parent.mkdir(parents=True)
        stale.write_text("from an attempt that crashed before its record")
        store.append(_full_record(store, "q1"))
        assert [p.name for p in store.spill_dir("q1").iterdir()] == [
            "0001-read_document-d1-1-200.txt"
        ]
    assert b"spills" not in (tmp_path / "run" / "records.jsonl").read_bytes()


def test_a_spill_name_from_a_record_cannot_leave_its_folder(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        record = _record(store, "q1")
        record.spills = {"../../outside.txt": "x"}
        with pytest.raises(ValueError, match="escapes"):
            store.append(record)
    assert not (tmp_path / "outside.txt").exists()


@pytest.mark.parametrize("blocker", ["run_dir_under_a_file", "records_is_a_directory"])
def test_an_unwritable_run_directory_is_refused_before_any_work(
    tmp_path: Path, blocker: str
) -> None:
    if blocker == "run_dir_under_a_file":
        (tmp_path / "file").write_text("")
        run = tmp_path / "file" / "run"
    else:
        run = tmp_path / "run"
        (run / "records.jsonl").mkdir(parents=True)
    with pytest.raises(RunStoreError, match=r"cannot write .*Nothing was run"):
        RunStore(run, RunConfig())


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 16])
def test_the_last_line_is_found_reading_backwards(tmp_path: Path, block: int) -> None:
    from piserini_ray.store.jsonl import _last_line

    for content in [b"", b"a", b"a\n", b"ab\ncd", b"ab\ncd\n", b"\n", b"ab\n\n", b"x\nyy\nzzz"]:
        path = tmp_path / "f"
        path.write_bytes(content)
        with open(path, "rb") as f:
            start, last = _last_line(f, block)
        body = content[:-1] if content.endswith(b"\n") else content
        expected = body.rfind(b"\n") + 1
        assert (start, last) == (expected, content[expected:]), (content, block)


def test_a_run_opened_from_a_moved_checkout_resumes_and_its_own_config_needs_no_data(
    tmp_path: Path,
) -> None:
    """The same config from another folder is the same run (its manifest takes the new paths,
    for `resume`); the run's own config opens it even when the data files are gone (`export`
    and `report` of a fetched run)."""
    data = '{"query_id": "1", "query": "q", "answer": "a"}\n'
    configs = []
    for where in ("first", "second"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "q.jsonl").write_text(data)
        (tmp_path / where / "c.jsonl").write_text('{"docid": "d", "text": "t"}\n')
        configs.append(
            load_config(
                None,
                {
                    "benchmark.source": "jsonl",
                    "benchmark.queries": str(tmp_path / where / "q.jsonl"),
                    "benchmark.corpus": str(tmp_path / where / "c.jsonl"),
                },
            )
        )
    with RunStore(tmp_path / "run", configs[0]) as store:
        store.append(_record(store, "1"))
    with RunStore(tmp_path / "run", configs[1]) as store:
        assert store.done() == {"1"}
        assert store.manifest.config["benchmark"]["queries"] == str(tmp_path / "second" / "q.jsonl")
        recorded = store.manifest
    shutil.rmtree(tmp_path / "second")
    own = RunConfig.model_validate(recorded.config)
    assert own.config_hash() != recorded.config_hash  # without its files it hashes otherwise
    with RunStore(tmp_path / "run", own) as store:
        assert store.done() == {"1"} and store.config_hash == recorded.config_hash


def test_a_run_recorded_by_an_older_version_opens_with_its_own_config(tmp_path: Path) -> None:
    """A manifest written before a setting existed (and under an older identity rule) still
    opens with the run's own config: resume, judge and report keep working."""
    config = RunConfig()
    with RunStore(tmp_path / "run", config) as store:
        store.append(_record(store, "q1"))
    path = tmp_path / "run" / "manifest.json"
    manifest = orjson.loads(path.read_bytes())
    manifest["config_hash"] = "0123456789abcdef"  # as an older identity rule hashed it
    del manifest["config"]["pricing"]["max_cost_usd"]  # a setting that did not exist yet
    path.write_bytes(orjson.dumps(manifest))
    with RunStore(tmp_path / "run", RunConfig.model_validate(manifest["config"])) as store:
        assert store.config_hash == "0123456789abcdef" and store.done() == {"q1"}


def _own_data(tmp_path: Path) -> RunConfig:
    """A config over a copy of the embedded sample that the test may edit in place."""
    from piserini_ray.data.loaders import sample_dir

    data = tmp_path / "data"
    shutil.copytree(sample_dir(), data)
    return load_config(
        None,
        {
            "benchmark.source": "jsonl",
            "benchmark.queries": str(data / "queries.jsonl"),
            "benchmark.corpus": str(data / "corpus.jsonl"),
            "benchmark.qrels_evidence": str(data / "qrels_evidence.txt"),
            "benchmark.qrels_gold": str(data / "qrels_gold.txt"),
        },
    )


def test_a_corpus_changed_in_place_is_refused_on_resume_never_mixed(tmp_path: Path) -> None:
    config = _own_data(tmp_path)
    with RunStore(tmp_path / "run", config) as store:
        store.append(_record(store, "q1"))
        assert set(store.manifest.data) >= {"benchmark.corpus", "benchmark.queries"}
        began = store.config_hash
    corpus = Path(str(config.benchmark.corpus))
    corpus.write_bytes(corpus.read_bytes() + b'{"docid": "new", "text": "another dataset"}\n')
    with pytest.raises(RunStoreError, match=r"benchmark\.corpus .* now has other content"):
        RunStore(tmp_path / "run", config)  # the same config, same paths: resume
    assert (tmp_path / "run" / "records.jsonl").read_text().count("\n") == 1  # nothing lost
    # The hash counts the content: without --run-dir, the new data names a new run.
    assert config.config_hash() != began


def test_a_run_holding_nothing_takes_the_changed_data(tmp_path: Path) -> None:
    config = _own_data(tmp_path)
    with RunStore(tmp_path / "run", config) as store:
        first = store.config_hash
    queries = Path(str(config.benchmark.queries))
    queries.write_text(queries.read_text().splitlines()[0] + "\n")
    with RunStore(tmp_path / "run", config) as store:
        assert store.config_hash != first and store.config_hash == config.config_hash()
        assert store.manifest.data == config.data_keys()


def test_the_turn_ledger_reopens_whole_after_a_torn_tail(tmp_path: Path) -> None:
    """The batches of a run's agent turns survive a kill mid-write: what was appended whole is
    read back (open batches, replies), a torn last line is cut off, and the next append is a
    line of its own."""
    from piserini_ray.store import TurnLedger

    path = tmp_path / "agent_batches.jsonl"
    ledger = TurnLedger(path)
    ledger.created("b1", ["r1", "r2"])
    ledger.replied("r1", {"choices": [{"message": {"content": "x"}}]})
    ledger.created("b2", ["r3"])
    ledger.closed("b2")
    with open(path, "ab") as f:
        f.write(b'{"id": "r2", "reply": {"choi')  # killed mid-write
    again = TurnLedger(path, log=lambda _m: None)
    assert again.open == {"b1": ["r1", "r2"]}
    assert set(again.replies) == {"r1"}
    again.replied("r2", {"choices": []})
    assert set(TurnLedger(path).replies) == {"r1", "r2"}


def test_the_judges_batches_stay_open_across_a_reopen_until_closed(tmp_path: Path) -> None:
    """`batches.jsonl` (`store/ledgers.py`): a batch noted before polling is found open again
    by the next store on the same run, per judge model, until it is closed."""
    with RunStore(tmp_path / "run", RunConfig()) as store:
        store.judge_batches.note_batch("judge-a", "batch_1", {"c1": "q1", "c2": "q2"})
        store.judge_batches.note_batch("judge-b", "batch_2", {"c3": "q3"})
    with RunStore(tmp_path / "run", RunConfig()) as store:
        assert store.judge_batches.open_batches("judge-a") == {"batch_1": {"c1": "q1", "c2": "q2"}}
        store.judge_batches.close_batch("judge-a", "batch_1")
    with RunStore(tmp_path / "run", RunConfig()) as store:
        assert store.judge_batches.open_batches("judge-a") == {}
        assert store.judge_batches.open_batches("judge-b") == {"batch_2": {"c3": "q3"}}


def test_a_report_file_is_written_whole_and_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's report writer (`store/report_files.py`): text and text bytes pass the
    scrubber, an image is written as it is, and no temporary file is left beside it."""
    from piserini_ray.store import write_report_file

    key = "sk-test-" + "7" * 24
    monkeypatch.setenv("PISERINI_TEST_API_KEY", key)
    report = write_report_file(tmp_path / "run" / "report.md", f"leaked {key}\n")
    data = write_report_file(tmp_path / "run" / "summary.json", orjson.dumps({"k": key}))
    image = write_report_file(tmp_path / "run" / "plot.png", key.encode(), binary=True)
    assert report.read_text() == "leaked ***\n"
    assert orjson.loads(data.read_bytes()) == {"k": "***"}
    assert image.read_bytes() == key.encode()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "plot.png",
        "report.md",
        "summary.json",
    ]


# Modules that write files of their own, none of them reports: the offline provider, indexes
# and their shipping, Ray's token, the MuSiQue converter, spill files (written by the store).
_OTHER_WRITERS = {
    "offline",
    "retrieval",
    "engines/ray",
    "store",
    "data/musique.py",
    "tools/spill.py",
    "reports/_format.py",  # figures rendered to bytes in memory
}
_WRITES = re.compile(r"\.write_(?:text|bytes)\(|\bopen\([^)]*[\"'][wax]b?\+?[\"']|\.savefig\(")


def test_every_report_file_is_written_by_the_store() -> None:
    """No module writes a report file (or any file into a run directory) by itself: reports,
    exports, the CLI and the pipeline go through `store/report_files.py`."""
    package = Path(__file__).parents[2] / "piserini_ray"
    writers = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if any(relative == w or relative.startswith(f"{w}/") for w in _OTHER_WRITERS):
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if _WRITES.search(line):
                writers.append(f"{relative}:{number}: {line.strip()}")
    assert writers == []
