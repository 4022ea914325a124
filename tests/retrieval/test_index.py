import fcntl
import shutil
import threading
from pathlib import Path

import orjson
import pytest

from piserini_ray.data import Benchmark
from piserini_ray.data.loaders import jsonl_corpus
from piserini_ray.errors import DataError, IndexBuildError
from piserini_ray.retrieval import build_index, find_index, read_index_info
from piserini_ray.retrieval.docstore import Docstore


def test_sample_index_is_complete(sample_index: Path, sample: Benchmark) -> None:
    info = read_index_info(sample_index)
    assert info.num_docs == 1890 and info.corpus == "musique-sample"
    assert (sample_index / "lucene").is_dir()
    store = Docstore(sample_index)
    doc = next(iter(sample.corpus))
    assert store.contents(store.ordinal[doc.docid]) == doc.contents()
    assert not (sample_index / "collection").exists()  # the temporary copy is removed


def test_second_build_is_a_lookup(sample_index: Path, sample: Benchmark, index_root: Path) -> None:
    before = (sample_index / "index.json").stat().st_mtime_ns
    logs: list[str] = []
    assert build_index(sample.corpus, index_root, log=logs.append) == sample_index
    assert logs == []  # nothing was built
    assert (sample_index / "index.json").stat().st_mtime_ns == before
    assert find_index(sample.corpus, index_root) == sample_index


def _corpus(tmp_path: Path, docs: list[dict], name: str = "c.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return jsonl_corpus(path, name="tiny")


def test_changed_corpus_gets_a_new_index_and_leftovers_are_cleared(tmp_path: Path) -> None:
    root = tmp_path / "idx"
    corpus = _corpus(tmp_path, [{"docid": "a", "text": "alpha"}])
    first = build_index(corpus, root)
    # An interrupted build of the next version left its temporary folder behind.
    changed = _corpus(tmp_path, [{"docid": "a", "text": "alpha"}, {"docid": "b", "text": "beta"}])
    second_path = root / f"tiny-{changed.fingerprint()[:16]}"
    stale = second_path.with_name(f".{second_path.name}.building")
    stale.mkdir(parents=True)
    (stale / "junk").write_text("half")
    second = build_index(changed, root)
    assert second == second_path != first
    assert read_index_info(second).num_docs == 2 and not stale.exists()


def test_a_build_holds_up_only_its_own_index(tmp_path: Path) -> None:
    """A 100K-document build must not stall runs over other corpora under the same root, and a
    second builder of the same index says that it waits (then finds the index built)."""
    root = tmp_path / "idx"
    built = build_index(_corpus(tmp_path, [{"docid": "a", "text": "alpha"}]), root)
    other = _corpus(tmp_path, [{"docid": "b", "text": "beta"}], name="other.jsonl")
    other_dir = root / f"tiny-{other.fingerprint()[:16]}"
    with open(root / f".{other_dir.name}.lock", "w") as held:  # "another process" builds it
        fcntl.flock(held, fcntl.LOCK_EX)
        again = _corpus(tmp_path, [{"docid": "a", "text": "alpha"}])
        assert build_index(again, root) == built  # not blocked by the other build
        logs: list[str] = []
        waiter = threading.Thread(target=lambda: build_index(other, root, log=logs.append))
        waiter.start()
        waiter.join(timeout=2.0)
        assert waiter.is_alive() and logs == [
            f"another process is building {other_dir}; waiting for it"
        ]
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(timeout=120)
    assert not waiter.is_alive() and read_index_info(other_dir).num_docs == 1


def test_duplicate_docids_fail_and_leave_nothing(tmp_path: Path) -> None:
    root = tmp_path / "idx"
    corpus = _corpus(tmp_path, [{"docid": "a", "text": "x"}, {"docid": "a", "text": "y"}])
    with pytest.raises(DataError, match="docid 'a' appears twice"):
        build_index(corpus, root)
    assert [p.name for p in root.iterdir() if p.is_dir()] == []


def test_empty_corpus_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(IndexBuildError, match="holds no documents"):
        build_index(_corpus(tmp_path, []), tmp_path / "idx")


def test_opening_an_incomplete_folder_says_what_to_do(tmp_path: Path, sample_index: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(sample_index, broken)
    (broken / "index.json").unlink()
    with pytest.raises(IndexBuildError, match="piserini-ray index"):
        read_index_info(broken)
