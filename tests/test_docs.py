"""The documentation site builds with `mkdocs build --strict`, its generated references are
complete (every config key of `RunConfig` and the models nested in it, every subcommand of the
argument parser, every public name of the API with its arguments, every field of the record
files), and every relative link in the README points at a file that exists."""

from __future__ import annotations

import argparse
import html
import importlib
import inspect
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


#: The record files, the model of a line of each, and whether every field of that model (and of
#: the models nested in it) must carry a description: those a user reads first.
RECORD_FILES = {
    "records.jsonl": ("piserini_ray.records", "QueryRecord", True),
    "judgements": ("piserini_ray.records", "Judgement", True),
    "manifest.json": ("piserini_ray.records", "RunManifest", True),
    "summary.json": ("piserini_ray.reports.run_metrics", "RunMetrics", False),
    "epochs.json": ("piserini_ray.reports.epochs", "EpochsReport", False),
}


def _id(prefix: str, name: str) -> str:
    slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()).strip("-")
    return f"{prefix}-{slug}"


def test_the_api_page_lists_every_public_name_with_its_arguments(site: Path) -> None:
    import piserini_ray

    page = _page(site, "api")
    names = [n for n in piserini_ray.__all__ if n != "__version__"]
    assert {"load_config", "run", "judge", "report", "RunConfig", "QueryRecord"} <= set(names)
    for name in names:
        value = getattr(piserini_ray, name)
        kind = "api" if inspect.isfunction(value) else "api-type"
        assert f'id="{_id(kind, name)}"' in page, f"{name} is not on the API page"
        assert f"from piserini_ray import {name}" in page, name
        if inspect.isfunction(value):
            section = page.split(f'id="{_id(kind, name)}"', 1)[1].split("<h3", 1)[0]
            for param in inspect.signature(value).parameters:
                assert f"<code>{param}</code>" in section, f"{name}({param}) is not documented"
            assert "Returns" in section and "Example" in section, name


def _record_models(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    if model in seen:
        return
    seen.add(model)
    yield model
    for field in model.model_fields.values():
        for nested in _models(field.annotation):
            yield from _record_models(nested, seen)


_ROW = r'id="{id}"></span><code>[^<]*</code></td>\s*<td>.*?</td>\s*<td>.*?</td>\s*<td>(.*?)</td>'


def test_the_records_page_documents_every_field_of_the_record_files(site: Path) -> None:
    page = _page(site, "records")
    seen: set[type[BaseModel]] = set()
    undescribed = []
    for file, (module, name, described) in RECORD_FILES.items():
        root = getattr(importlib.import_module(module), name)
        assert file in page and f'id="{_id("records", name)}"' in page, file
        for model in _record_models(root, seen):
            for field in model.model_fields:
                row = _id("records", f"{model.__name__}-{field}")
                found = re.search(_ROW.format(id=re.escape(row)), page, re.DOTALL)
                assert found, f"{model.__name__}.{field} ({file}) is not on the records page"
                if described and not found.group(1).strip():
                    undescribed.append(f"{model.__name__}.{field}")
    assert len(seen) > 10  # the walk reached the nested models (Turn, Usage, Estimate, ...)
    assert not undescribed, f"record fields without a description: {undescribed}"


#: What would send a reader outside the repository: the shared folder the project grew up
#: beside (its spec, data and CRDs), or the spec's old section citations.
OUTSIDE = re.compile(
    r"SPEC §|SPEC\.md|ARCHITECTURE\.md|shared/spec|shared/data|shared/k8s|\.\./shared|"
    r"/work/shared|PISERINI_RAY_SHARED|shared `spec/`"
)
#: Where a reader (or a test) could be sent: the docs, the code, the tests, the configs.
SOURCES = ("README.md", "mkdocs.yml", "Makefile", "pyproject.toml")
FOLDERS = ("docs", "piserini_ray", "tests", "configs", "jobs", "bench")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt"}


def _texts() -> Iterator[tuple[str, str]]:
    for name in SOURCES:
        yield name, (ROOT / name).read_text(encoding="utf-8")
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


def test_nothing_sends_a_reader_outside_the_repository() -> None:
    found = [
        f"{name}:{n}: {line.strip()}"
        for name, text in _texts()
        if name != "tests/test_docs.py"
        for n, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_every_citation_of_the_spec_names_one_of_its_sections() -> None:
    spec = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^##+ [^{]*\{#(s[0-9-]+)\}", spec, re.MULTILINE))
    assert {f"s{n}" for n in range(1, 16)} <= sections
    cited = []
    for name, text in _texts():
        for number in re.findall(r"docs/spec\.md §(\d+)", text):
            cited.append((name, f"s{number}"))
        for anchor in re.findall(r"spec\.md#(s[0-9-]+)", text):
            cited.append((name, anchor))
    assert len(cited) > 30  # the code and the guides cite it
    unknown = [f"{name}: {anchor}" for name, anchor in cited if anchor not in sections]
    assert not unknown, f"citations of sections the spec does not have: {unknown}"


def test_the_readme_is_short_and_gives_the_two_commands() -> None:
    """At most 200 lines: what it is, the two commands (and the fast tier), a first real run,
    a cluster in five lines, where to go next; the rest lives in the guides."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines"
    for needed in ("make run", "make test", "make test-fast", "## A first real run",
                   "## A cluster in five lines", "## Where to go next"):  # fmt: skip
        assert needed in text, f"README.md does not say {needed!r}"


def test_the_architecture_page_lists_the_layers_of_the_contract_and_every_module() -> None:
    """docs/architecture.md's layer list is the `layers` contract of pyproject.toml, layer for
    layer and separator for separator, and every module and package of `piserini_ray` is in
    one layer (a module in none would escape the contract)."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["type"] == "layers")["layers"]
    page = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.findall(r"^\d+\. (`.*)$", page.split("## Layer rules", 1)[1], re.M)
    assert [line.replace("`", "") for line in listed] == layers
    in_layers = {name.strip() for layer in layers for name in re.split(r"[:|]", layer)}
    package = ROOT / "piserini_ray"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in package.glob("*/__init__.py")
    }
    assert modules <= in_layers, f"in no layer: {sorted(modules - in_layers)}"
