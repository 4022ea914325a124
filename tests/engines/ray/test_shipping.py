"""Index shipping trusts only the driver's hashes: every reused or received file is hashed
against the driver's list (names and sizes are not enough), unsafe names and extra files are
refused, received chunks must have the length asked for. The functions run on real folders,
without Ray (a folder that fails is never fetched here: a good copy is already in place)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from piserini_ray.config.hashing import sha256_of, stamp
from piserini_ray.engines.ray.shipping import (
    IndexSource,
    _record,
    local_index,
    trusted_list,
    verified,
    write_chunk,
)
from piserini_ray.errors import DataError
from piserini_ray.retrieval import index_files as index_files_module
from piserini_ray.retrieval.index_files import (
    IndexFile,
    IndexFiles,
    index_files,
    read_json_cache,
)

FILES = {"index.json": b'{"docs": 3}', "segments_1": b"seg" * 100, "_0.cfs": b"lucene" * 1000}


def _index(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    return folder


def _flip_in_place(path: Path) -> None:
    """One byte changed, size and modification time as they were."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PISERINI_RAY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_folder_with_the_same_names_and_sizes_is_hashed_not_trusted(
    tmp_path: Path, home: Path
) -> None:
    driver = _index(tmp_path / "idx-abc")
    files = index_files(driver)
    source = IndexSource(path=str(driver), files=files, server="none")
    assert local_index(source) == driver  # it matches: used where it is
    # The same names and sizes, one byte changed (its mtime put back): not used. A good copy
    # shipped earlier is used instead (without one, it would be fetched).
    shipped = _index(home / "indexes" / "shipped" / files.content_key / files.name)
    _flip_in_place(driver / "_0.cfs")
    logged: list[str] = []
    assert local_index(source, logged.append) == shipped
    assert "does not match the driver's file list" in logged[0] and "_0.cfs" in logged[0]


def test_the_nodes_record_never_masks_a_change(tmp_path: Path, home: Path) -> None:
    folder = _index(tmp_path / "idx")
    files = index_files(folder)
    assert verified(folder, files) == []
    _flip_in_place(folder / "segments_1")  # within the kernel's clock tick of the hash
    assert verified(folder, files) == ["segments_1"]


def test_a_node_records_what_it_hashed_once_settled(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _index(tmp_path / "idx")
    files = index_files(folder)
    assert verified(folder, files) == []
    assert read_json_cache(_record(folder, files)) == {}  # just written: never recorded
    monkeypatch.setattr(index_files_module, "SETTLE_NS", -(10**12))  # as if long settled
    assert verified(folder, files) == []
    record = read_json_cache(_record(folder, files))
    assert sorted(record) == sorted(FILES)
    assert record["_0.cfs"] == {
        "stamp": stamp(folder / "_0.cfs"),
        "sha256": sha256_of(folder / "_0.cfs"),
    }


def test_the_lock_lucene_leaves_in_a_subfolder_is_not_an_extra_file(
    tmp_path: Path, home: Path
) -> None:
    """The index folder pyserini writes keeps Lucene's `lucene/write.lock`: the driver's own
    node uses its folder as it is, and ships nothing to itself."""
    folder = _index(tmp_path / "idx")
    (folder / "lucene").mkdir()
    (folder / "lucene" / "write.lock").write_bytes(b"")
    files = index_files(folder)
    assert "lucene/write.lock" not in [f.path for f in files.files]
    assert verified(folder, files) == []
    source = IndexSource(path=str(folder), files=files, server="none")
    assert local_index(source) == folder


def test_an_extra_file_is_refused(tmp_path: Path, home: Path) -> None:
    folder = _index(tmp_path / "idx")
    files = index_files(folder)
    (folder / "segments_9").write_bytes(b"a newer commit Lucene would open")
    (folder / "x.tmp").write_bytes(b"")
    assert verified(folder, files) == [
        "segments_9 (not in the index's file list)",
        "x.tmp (not in the index's file list)",
    ]


@pytest.mark.parametrize(
    "name", ["../outside", "/etc/passwd", "a//b", "./a", "a/../../b", "", "files.json", "a\\b"]
)
def test_unsafe_names_in_the_list_are_refused(tmp_path: Path, name: str) -> None:
    digest = "0" * 64
    with pytest.raises(ValidationError):
        IndexFile(path=name, size=1, sha256=digest)
    # A list that crossed a process unvalidated (as Ray unpickles it) is checked where it lands.
    bad = IndexFiles.model_construct(
        name="idx", files=[IndexFile.model_construct(path=name, size=1, sha256=digest)]
    )
    with pytest.raises(DataError, match="unsafe"):
        trusted_list(IndexSource.model_construct(path=str(tmp_path), files=bad, server="s"))
    with pytest.raises(DataError, match="refused"):
        write_chunk(tmp_path / "partial", (name, 0, 1), b"x")
    assert not (tmp_path / "partial").exists()


@pytest.mark.parametrize("name", ["..", ".", "a/b", ""])
def test_the_index_name_is_one_folder_name(name: str) -> None:
    with pytest.raises(ValidationError):
        IndexFiles(name=name, files=[])


def test_a_short_or_long_chunk_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="3 bytes, not 4"):
        write_chunk(tmp_path, ("_0.cfs", 0, 4), b"abc")
    with pytest.raises(DataError, match="5 bytes, not 4"):
        write_chunk(tmp_path, ("_0.cfs", 8, 4), b"abcde")
    write_chunk(tmp_path, ("_0.cfs", 0, 4), b"abcd")
    assert (tmp_path / "_0.cfs").read_bytes() == b"abcd"
