"""Headless Chromium for the HTML report's tests (Debian's `chromium`, which `.ci/run`
installs; without it those tests are skipped and say so: no other browser may be downloaded)."""

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)"
)


def dump_dom(url: str, profile: Path) -> str:
    """The DOM of a page after its scripts ran (and the scripts they loaded)."""
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
            "--dump-dom", url,
        ],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
