"""Small helpers the tests share: a state waited for, and a program run in a fresh
interpreter (what a module loads is seen only where nothing was imported yet)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def wait_for(
    what: str,
    condition: Callable[[], bool],
    deadline_s: float = 300,
    explain: Callable[[], str] | None = None,
) -> None:
    """Wait for a state, not a duration (the deadline only turns a hang into a failure);
    `explain` adds what the failure's message should show of the state seen last."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            seen = f":\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out waiting for {what}{seen}")
        time.sleep(0.2)


def file_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file, for a failure's message (why it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"({error.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def fresh_python(program: str, timeout: float = 120) -> str:
    """`program`'s standard output, run by `python -c` in a new interpreter; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def marked_results(stdout: str, marker: str = "RESULT ") -> list[str]:
    """The text after `marker` on each line that has it. A driver's own print can land after
    a replica line that Ray forwards to the same stdout from another thread (`print` writes the
    text and its newline apart), so the marker is looked for anywhere in a line."""
    return [line.rpartition(marker)[2] for line in stdout.splitlines() if marker in line]


def llama_servers() -> dict[int, str]:
    """Every llama.cpp server process on this machine (llama-cpp-python's, `make serving`):
    its PID and command line."""
    from pathlib import Path

    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"llama_cpp.server" in argv:
            found[int(cmdline.parent.name)] = b" ".join(argv).decode(errors="replace")
    return found


def serving_python() -> str:
    """The Python of the real model server's environment (`make serving`); a test that needs
    it fails, naming the fix, where it is missing."""
    from pathlib import Path

    import pytest

    python = Path(__file__).resolve().parents[1] / ".venv-serving" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: `make serving` builds the model server")
    return str(python)
