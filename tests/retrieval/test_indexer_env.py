"""The indexer's subprocess gets an environment without key variables, whatever they are
called: only what Python, the JVM and this package read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from piserini_ray.retrieval.index import indexer_env


def test_the_indexer_child_sees_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_THING", "canary-indexer-0123456789")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-indexer-0123456789")
    monkeypatch.setenv("PISERINI_RAY_TOKEN", "canary-indexer-token-0123")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = indexer_env("1g")
    seen = json.loads(
        subprocess.run(
            [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    assert "canary" not in json.dumps(seen)
    assert {"PATH", "JAVA_HOME", "PISERINI_RAY_JVM_HEAP", "LC_ALL"} <= set(seen)
    assert seen["PISERINI_RAY_JVM_HEAP"] == "1g"
