from pathlib import Path

import pytest

from piserini_ray.config import RunConfig, load_config
from piserini_ray.store import QueryRecord, RunStore, RunStoreError, now_iso


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
    RunStore(tmp_path / "run", RunConfig()).close()
    other = load_config(None, {"agent.budget_seconds": 60})
    with pytest.raises(RunStoreError, match=r"config hash .* `piserini-ray resume"):
        RunStore(tmp_path / "run", other)


def test_one_process_at_a_time(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()), pytest.raises(RunStoreError, match="in use"):
        RunStore(tmp_path / "run", RunConfig())


def test_spill_dirs_stay_inside_the_run(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run", RunConfig()) as store:
        spill = store.spill_dir("../../etc")
    assert spill.resolve().is_relative_to((tmp_path / "run" / "spill").resolve())
