"""Epochs (issue 24): each query runs k times with distinct seeds, one directory per epoch;
records are keyed by query and epoch; resume is per epoch and more epochs can be added later;
the report's mean ± sd and pass@k / pass^k equal a computation from the verdicts on disk. The
offline heuristic samples its answer at temperature 1 from the request's seed."""

from __future__ import annotations

import statistics
from pathlib import Path

import orjson

from piserini_ray.cli import main

QUERIES = 6


def _rows(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _config(tmp_path: Path, index_root: Path, epochs: int) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        "model: {name: offline/heuristic, temperature: 1.0}\n"
        f"slice: {{sample: {QUERIES}, seed: 11}}\n"
        f"retrieval: {{index_root: '{index_root}'}}\n"
        f"run: {{epochs: {epochs}}}\n"
    )
    return path


def _run(*args: str) -> int:
    return main([*args, "--engine", "local", "--concurrency", "3"])


def test_three_epochs_resume_per_epoch_and_report_mean_sd_and_pass_at_k(
    tmp_path: Path, index_root: Path, sample_index: Path, capsys
) -> None:
    run_dir = tmp_path / "run"
    # Two epochs first; a third is added later to the same run.
    assert _run("run", "--config", str(_config(tmp_path, index_root, 2)),
                "--run-dir", str(run_dir)) == 0  # fmt: skip
    dirs = [run_dir, run_dir / "epochs" / "2", run_dir / "epochs" / "3"]
    assert len(_rows(dirs[0] / "records.jsonl")) == len(_rows(dirs[1] / "records.jsonl")) == 6
    assert not dirs[2].exists()

    # An interrupted epoch: its last record is lost; resume runs just that one, in that epoch,
    # and adds epoch 3 (--epochs 3) without touching epoch 1.
    lines = (dirs[1] / "records.jsonl").read_bytes().splitlines(keepends=True)
    (dirs[1] / "records.jsonl").write_bytes(b"".join(lines[:-1]))
    lost = orjson.loads(lines[-1])["query_id"]
    first_epoch = (dirs[0] / "records.jsonl").read_bytes()
    capsys.readouterr()
    assert _run("resume", str(run_dir), "--epochs", "3") == 0
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    assert f"run {dirs[0]}: 6 queries, 6 already recorded, 0 to run" in err
    assert f"run {dirs[1]}: 6 queries, 5 already recorded, 1 to run" in err
    assert f"run {dirs[2]}: 6 queries, 0 already recorded, 6 to run" in err
    assert (dirs[0] / "records.jsonl").read_bytes() == first_epoch

    records = [_rows(d / "records.jsonl") for d in dirs]
    assert [len(r) for r in records] == [6, 6, 6]
    assert records[1][-1]["query_id"] == lost
    for epoch, rows in enumerate(records, 1):  # keyed by query and epoch
        assert {r["epoch"] for r in rows} == {epoch}
        assert len({r["query_id"] for r in rows}) == 6
    hashes = {rows[0]["config_hash"] for rows in records}
    assert len(hashes) == 3  # each epoch is its own identity (its seed)
    # Distinct seeds give distinct samples: some query's answer differs between epochs.
    answers = {r["query_id"]: set() for r in records[0]}
    for rows in records:
        for r in rows:
            answers[r["query_id"]].add(r["exact_answer"])
    assert any(len(a) > 1 for a in answers.values()), answers

    # The report against a computation from the verdicts on disk.
    verdicts = []
    for d in dirs:
        (path,) = (d / "judgements").glob("*.jsonl")
        verdicts.append({j["query_id"]: bool(j["correct"]) for j in _rows(path)})
    per_epoch = [sum(v.values()) / 6 for v in verdicts]
    report = orjson.loads((run_dir / "epochs.json").read_bytes())
    stats = report["stats"]
    assert stats["queries"] == 6 and stats["epochs"] == 3 and report["seeds"] == [None, 2, 3]
    assert stats["accuracy_per_epoch"] == per_epoch
    assert abs(stats["accuracy_mean"] - statistics.fmean(per_epoch)) < 1e-12
    assert abs(stats["accuracy_sd"] - statistics.stdev(per_epoch)) < 1e-12
    solved = [[v[q] for v in verdicts] for q in answers]
    assert stats["pass_at"]["3"] == sum(any(s) for s in solved) / 6
    assert stats["pass_all"]["3"] == sum(all(s) for s in solved) / 6
    markdown = (run_dir / "epochs.md").read_text()
    assert "3 epochs of 6 queries" in markdown and "pass^k" in markdown
    assert "## Epochs: offline/heuristic, 3 epochs of 6 queries" in out
