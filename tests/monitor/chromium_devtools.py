"""Real headless Chromium (Debian's, which `.ci/run` installs) driven over the DevTools
protocol: a page stays open while the test reads its DOM again and again, so what updates
without a reload is seen updating. No other browser is ever downloaded."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for
from websockets.sync.client import connect

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)"
)


class Browser:
    """One headless Chromium with one page open at `url`."""

    def __init__(self, url: str, profile: Path) -> None:
        assert CHROMIUM is not None
        self.process = subprocess.Popen(
            [
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                "--window-size=1500,700", url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        port_file = profile / "DevToolsActivePort"
        wait_for("Chromium's DevTools port", lambda: port_file.exists() and port_file.read_text())
        port = port_file.read_text().split()[0]

        def pages() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as answer:
                return [t for t in json.loads(answer.read()) if t["type"] == "page"]

        wait_for("the page's target", lambda: bool(pages()))
        self._open = contextlib.ExitStack()
        url = pages()[0]["webSocketDebuggerUrl"]
        self.socket = self._open.enter_context(connect(url, max_size=None))
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command and its result."""
        number = next(self._ids)
        self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == number:
                assert "error" not in message, message
                return dict(message["result"])

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self._open.close()
        self.process.terminate()
        self.process.wait(timeout=30)
