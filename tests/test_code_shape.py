"""The shape of the code, checked where a reviewer would measure it (issue 50): no module of the
package or the test kit over 600 lines, no function over 80, every module of the package under
the contract that keeps Ray inside the Ray engine, and tests laid out like the package."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("piserini_ray", "piserini_ray_testkit")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
#: Test folders that are not a package of the product: data, recorded outputs, the kit's tests.
NOT_PACKAGES = {"fixtures", "golden", "testkit"}


def _modules() -> list[Path]:
    return sorted(p for source in SOURCES for p in (ROOT / source).rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"


def test_no_function_is_over_80_lines() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_package_outside_the_ray_engine_is_kept_from_importing_ray() -> None:
    """A new top-level module must be named in the contract that keeps `ray` in `engines.ray`
    (otherwise it could import Ray unchecked)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    only_ray = next(c for c in contracts["contracts"] if c["name"].startswith("Only the Ray"))
    package = ROOT / "piserini_ray"
    top = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in package.glob("*/__init__.py")
    }
    engines = {p.stem for p in (package / "engines").glob("*.py") if p.stem != "__init__"}
    named = set(only_ray["source_modules"])
    expected = {f"piserini_ray.{m}" for m in top - {"engines"}} | {
        f"piserini_ray.engines.{m}" for m in engines
    }
    assert expected <= named, f"not kept from importing Ray: {sorted(expected - named)}"


def test_the_tests_are_laid_out_like_the_package() -> None:
    """Every folder of tests/ is a package of `piserini_ray` (or its subpackage's path), so a
    test is found where its code is."""
    package = ROOT / "piserini_ray"
    strays = [
        str(folder.relative_to(ROOT))
        for folder in sorted((ROOT / "tests").rglob("*"))
        if folder.is_dir()
        and "__pycache__" not in folder.parts
        and folder.relative_to(ROOT / "tests").parts[0] not in NOT_PACKAGES
        and not (package / folder.relative_to(ROOT / "tests")).is_dir()
    ]
    assert not strays, f"test folders with no package of that name: {strays}"
