"""The searchers' JVM class archive (`retrieval/class_archive.py`): dumped by the real runtime,
mapped by a searcher's JVM in a new interpreter (its classes read from the archive, as the
JVM's own class-loading log says), and only ever an optimization (a damaged file is ignored)."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import orjson
import pytest
from helpers import fresh_python

from piserini_ray.retrieval import class_archive, jvm

#: In a new interpreter: archives only in FOLDER, a searcher on INDEX, the JVM given OPTIONS
#: (JAVA_TOOL_OPTIONS: read by any JVM, pyjnius's too). Its output must be the ranking alone:
#: the JVM prints its warnings on standard output.
SEARCH = """
import json, os
from pathlib import Path
from piserini_ray.retrieval import class_archive
class_archive.archive_folders = lambda: [Path({folder!r})]
os.environ["JAVA_TOOL_OPTIONS"] = {options!r}
from piserini_ray.config import RetrievalConfig
from piserini_ray.retrieval.searcher import open_searcher
searcher = open_searcher(Path({index!r}), RetrievalConfig())
ranking = searcher.search("the capital of the country", 10)
print(json.dumps([searcher.docid(int(o)) for o in ranking.ordinals]))
"""


def _search(folder: Path, index: Path, loaded: Path) -> tuple[list[str], dict[str, int]]:
    """Top docids of a search, and how many Lucene / Anserini classes came from the archive
    ("shared") or were parsed from the jar ("jar")."""
    options = f"-Xlog:class+load=info:file={loaded}"  # where each class came from
    docids = _ranking(folder, index, options)
    sources = {"shared": 0, "jar": 0}
    for line in loaded.read_text().splitlines():
        if " org.apache.lucene." in line or " io.anserini." in line:
            sources["shared" if "shared objects file" in line else "jar"] += 1
    return docids, sources


def _ranking(folder: Path, index: Path, options: str = "") -> list[str]:
    program = SEARCH.format(folder=str(folder), options=options, index=str(index))
    return list(orjson.loads(fresh_python(textwrap.dedent(program))))


@pytest.fixture
def archives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "archives"
    monkeypatch.setattr(class_archive, "archive_folders", lambda: [folder])
    return folder


def test_a_searcher_maps_its_classes_from_the_archive(
    archives: Path, sample_index: Path, tmp_path: Path
) -> None:
    without, parsed = _search(archives, sample_index, tmp_path / "without.log")
    assert parsed["shared"] == 0 and parsed["jar"] > 500  # no archive yet: all parsed

    made = jvm.ensure_class_archive()
    assert made is not None and made.parent == archives and made.stat().st_size > 1 << 20
    assert jvm.ensure_class_archive() == made  # found, not dumped again

    ranked, mapped = _search(archives, sample_index, tmp_path / "with.log")
    assert ranked == without  # the same searcher, the same ranking
    # The class list covers what a searcher loads: fails once an upgrade of Anserini leaves
    # it stale (then: python -m piserini_ray.retrieval._archive_main --record INDEX).
    assert mapped["shared"] >= 0.95 * (mapped["shared"] + mapped["jar"]), mapped


def test_a_damaged_archive_is_ignored_quietly(archives: Path, sample_index: Path) -> None:
    home = jvm.java_home()
    name = class_archive.archive_name(home, jvm.anserini_jar(), jvm.module_options(home))
    archives.mkdir()
    (archives / name).write_bytes(b"not an archive" * 1000)
    assert len(_ranking(archives, sample_index)) == 10  # it searched, and said nothing
    assert jvm.ensure_class_archive() == archives / name  # (a file the JVM judges, not us)


def test_another_jar_gets_another_archive(tmp_path: Path) -> None:
    """The JVM refuses an archive dumped with another jar (and says so on stderr): the name
    tells them apart, so a changed install never meets its old archive."""
    home, jar = jvm.java_home(), tmp_path / "anserini.jar"
    shutil.copy(jvm.anserini_jar(), jar)
    before = class_archive.archive_name(home, jar, [])
    os.utime(jar, ns=(0, 0))
    assert class_archive.archive_name(home, jar, []) != before
    assert class_archive.archive_name(home, jar, ["--add-modules=x"]) != before
    assert class_archive.archive_name(home, jvm.anserini_jar(), []) != before
