"""Export file names are safe path components whatever a query id holds: inside the export
folder, short enough for any file system."""

from __future__ import annotations

from pathlib import Path

import pytest

from piserini_ray.formats.peer_writers import run_file_name


@pytest.mark.parametrize(
    "query_id", ["../../escape", "a/b", "/etc/passwd", "..", "", "x" * 300, "7" * 300, "q 1"]
)
def test_a_hostile_query_id_names_a_file_inside_the_export(tmp_path: Path, query_id: str) -> None:
    name = run_file_name(query_id, 12)
    path = tmp_path / name
    path.write_text("{}")  # a name too long for the file system would fail here
    assert path.resolve().parent == tmp_path.resolve() and name.startswith("run_")
    assert len(name.encode()) <= 255


def test_a_plain_query_id_is_kept() -> None:
    assert run_file_name("msq-7976b1e35e0a", 1) == "run_msq-7976b1e35e0a.json"
