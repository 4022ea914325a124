"""The command line, run as a user runs it: a subprocess with its own JVM."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import GOLDEN


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PISERINI_RAY_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "piserini_ray.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_search_and_read_print_what_the_agent_sees(sample_index: Path, tmp_path: Path) -> None:
    root = str(sample_index.parent)
    out = _cli("search", "Journal of Psychotherapy Integration publisher", "--index-root", root,
               home=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == (GOLDEN / "search.txt").read_text() + "\n"
    out = _cli("read", "msq-7976b1e35e0a", "--index-root", root, home=tmp_path)
    assert out.stdout == (GOLDEN / "read_document.txt").read_text() + "\n"
    out = _cli("read", "no-such-doc", "--index-root", root, home=tmp_path)
    assert out.returncode == 1 and "Error: unknown docid 'no-such-doc'" in out.stdout


def test_run_builds_the_index_then_searches_and_reads(tmp_path: Path) -> None:
    out = _cli("run", "--show", "1", home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "building the index of musique-sample" in out.stderr
    assert "Search s1 for" in out.stdout and "Document msq-" in out.stdout
    assert "100 raw-question searches at depth 1000" in out.stdout
    assert list((tmp_path / "indexes").glob("musique-sample-*/index.json"))
    again = _cli("index", home=tmp_path)
    assert again.returncode == 0 and "building" not in again.stderr
    assert "1890 documents" in again.stdout


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("benchmark:\n  source: jsonl\n")
    out = _cli("index", "--config", str(config), home=tmp_path)
    assert out.returncode == 2
    assert "needs benchmark.queries and benchmark.corpus" in out.stderr
