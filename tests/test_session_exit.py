"""The test session's exit status is pytest's own: a session that failed anywhere, a hook
included, exits non-zero, and atexit handlers (coverage's, for one) run. Each case runs a
real pytest session, with this project's conftest and configuration, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: One quick test of the suite, so that the session loads the real conftest and settings.
QUICK = "tests/test_errors.py::test_every_error_pickles_to_itself"


def _session(tmp_path: Path, plugin: str, test: str = QUICK) -> subprocess.CompletedProcess[str]:
    (tmp_path / "session_probe.py").write_text(textwrap.dedent(plugin))
    return subprocess.run(
        [sys.executable, "-m", "pytest", test, "-q", "-p", "session_probe",
         "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip


def test_a_hook_that_raises_fails_the_session_and_atexit_handlers_run(tmp_path: Path) -> None:
    done = _session(
        tmp_path,
        """
        import atexit

        atexit.register(lambda: print("atexit handler ran", flush=True))

        def pytest_sessionfinish(session, exitstatus):
            raise RuntimeError("a hook at the session's end failed")
        """,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "a hook at the session's end failed" in output
    assert "atexit handler ran" in output


def test_a_green_session_exits_zero_and_runs_atexit_handlers(tmp_path: Path) -> None:
    done = _session(
        tmp_path,
        """
        import atexit

        atexit.register(lambda: print("atexit handler ran", flush=True))
        """,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed" in done.stdout and "atexit handler ran" in done.stdout


def test_a_failing_test_fails_the_session(tmp_path: Path) -> None:
    done = _session(
        tmp_path,
        """
        def pytest_runtest_call(item):
            raise AssertionError("this test fails")
        """,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert " failed in " in done.stdout and " passed" not in done.stdout


@pytest.mark.heavy  # its session starts Ray
def test_a_session_that_ran_ray_ends_by_its_own_path_without_a_native_crash(
    tmp_path: Path,
) -> None:
    # No os._exit in the conftest: a session that started Ray and its actors goes through
    # finalization and C++ teardown like any other.
    done = _session(
        tmp_path,
        """
        import atexit

        atexit.register(lambda: print("atexit handler ran", flush=True))
        """,
        "tests/engines/ray/test_startup.py::test_a_replica_lacking_the_index_fetches_it_from_the_drivers_node_and_nothing_else",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "1 passed" in done.stdout and "atexit handler ran" in done.stdout
    for crash in ("terminate called", "Fatal Python error", "Aborted", "Segmentation fault"):
        assert crash not in output, output
    assert "os._exit" not in (ROOT / "tests" / "conftest.py").read_text()
