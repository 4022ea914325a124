"""The lock (`requirements.lock`) is the install: every requirement of `pyproject.toml` (the dev
extra's included) is pinned there to a version it allows, every pin carries hashes, and this
environment holds exactly the pinned versions (what `make setup` installs)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _lock() -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, its hashes)."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    name = None
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := PIN.match(line):
            name = canonicalize_name(match[1])
            pins[name] = (Version(match[2]), [])
        elif name and (found := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            pins[name][1].append(found[1])
        elif not line.startswith(" "):
            name = None
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]] + [
        Requirement(r) for r in project["optional-dependencies"]["dev"]
    ]


def test_every_declared_requirement_is_pinned_in_the_lock_to_a_version_it_allows() -> None:
    pins = _lock()
    assert len(pins) > 100  # the transitive closure, not the direct list
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is in pyproject.toml but not in the lock: run `make lock`"
        version = pins[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"the lock pins {name}=={version}, which pyproject.toml's {requirement} refuses: "
            "run `make lock`"
        )


def test_every_pin_carries_hashes() -> None:
    unhashed = [name for name, (_, hashes) in _lock().items() if not hashes]
    assert not unhashed, f"pins without hashes: {unhashed} (run `make lock`)"


def test_this_environment_holds_exactly_the_locked_versions() -> None:
    wrong = {}
    for name, (version, _) in _lock().items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            wrong[name] = (str(version), None)
            continue
        if installed != version:
            wrong[name] = (str(version), str(installed))
    assert not wrong, f"locked vs installed: {wrong} (run `make setup`)"


def test_the_lean_start_is_written_for_the_locked_ray() -> None:
    """A Ray bumped in the lock runs the plain start (`engines/ray/ray_env.lean_start_applies`)
    until its private functions are checked again and `LEAN_START_RAY` follows."""
    from piserini_ray.engines.ray.ray_env import LEAN_START_RAY

    assert _lock()[canonicalize_name("ray")][0] == Version(LEAN_START_RAY), (
        "requirements.lock pins another Ray than runtime/ray_env.LEAN_START_RAY: check the "
        "lean start's replaced functions against it (tests/engines/ray/test_ray_env.py), then "
        "update LEAN_START_RAY"
    )
