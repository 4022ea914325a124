"""The documentation site builds with `mkdocs build --strict`, its generated references are
complete (every config key of `RunConfig` and the models nested in it, every subcommand of the
argument parser), and every relative link in the README points at a file that exists."""

from __future__ import annotations

import argparse
import html
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from piserini_ray.cli import build_parser
from piserini_ray.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} is missing: mkdocs is a dev dependency (`make setup` installs it)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def _page(site: Path, name: str) -> str:
    return html.unescape((site / "reference" / name / "index.html").read_text(encoding="utf-8"))


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def _config_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The dotted path of every field of `model` and of every model nested in it."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        yield key
        for nested in _models(field.annotation):
            if nested is not model:
                yield from _config_keys(nested, f"{key}.")


def test_the_config_reference_lists_every_field_of_every_nested_model(site: Path) -> None:
    page = _page(site, "configuration")
    keys = list(_config_keys(RunConfig))
    assert len(keys) > 100  # the walk reached the nested models
    assert "offline.latency.kind" in keys and "model.rate_limit.tokens_per_minute" in keys
    missing = [key for key in keys if f"<code>{key}</code>" not in page]
    assert not missing, f"config keys missing from the configuration reference: {missing}"


def test_the_cli_reference_lists_every_subcommand(site: Path) -> None:
    page = _page(site, "cli")
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands = {name: sub for action in actions for name, sub in action.choices.items()}
    assert {"run", "resume", "judge", "report", "compare", "sweep"} <= set(commands)
    missing = [name for name in commands if f"<code>piserini-ray {name}</code>" not in page]
    assert not missing, f"subcommands missing from the CLI reference: {missing}"
    for name, sub in commands.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # every command takes -h / --help, said once on the page
            for option in action.option_strings:
                assert f"<code>{option}</code>" in page, f"{name} {option} is not documented"


_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def test_every_relative_link_in_the_readme_points_to_a_file_that_exists() -> None:
    text = _FENCE.sub("", (ROOT / "README.md").read_text(encoding="utf-8"))
    targets = _LINK.findall(text) + _REFERENCE.findall(text)
    relative = [
        t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")
    ]
    assert any(t.startswith("docs/") for t in relative), "the README links into docs/"
    broken = [t for t in relative if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"
