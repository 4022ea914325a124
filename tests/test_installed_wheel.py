"""The package as a user installs it: a wheel built from this tree, installed with exactly
`requirements.lock` into a fresh virtual environment, runs the main job from a folder outside
the checkout, and `piserini-ray report` reads the result. The same steps as the KubeRay image's
(`jobs/k8s/Dockerfile`), so this is the image's test here (no container runtime)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import orjson
import pytest

from piserini_ray import load_config
from piserini_ray.pipeline import default_run_dir

ROOT = Path(__file__).resolve().parents[1]
#: What no wheel of ours may carry: the test tree, fixtures, the test kit, and files that hold
#: credentials.
FORBIDDEN = re.compile(
    r"(^|/)(tests?|fixtures|piserini_ray_testkit)/|(^|/)\.env$|\.(pem|key|p12)$|(^|/)(id_rsa|\.netrc|auth_token)"
)


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args[:4]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def _clean_environment(home: Path) -> dict[str, str]:
    """The machine's environment, less what points at this checkout or its venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PISERINI_RAY_HOME")
        and not k.startswith("PYTEST")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))
    )
    env["PISERINI_RAY_HOME"] = str(home)
    return env


@pytest.mark.slow
@pytest.mark.heavy
def test_a_wheel_installed_from_the_lock_runs_the_main_job_outside_the_checkout(
    tmp_path: Path,
) -> None:
    # The wheel, built with the lock's setuptools (no build isolation: nothing fetched).
    dist = tmp_path / "dist"
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(dist), str(ROOT)],
        cwd=tmp_path,
    )  # fmt: skip
    assert "Deprecat" not in build.stdout + build.stderr, build.stderr[-3000:]
    (wheel,) = dist.glob("piserini_ray-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "piserini_ray/pricing.yaml" in names  # what a run reads by default travels with it
    assert [n for n in names if FORBIDDEN.search(n)] == []
    assert {n.split("/")[0] for n in names} == {"piserini_ray", "piserini_ray-0.1.0.dist-info"}

    # A fresh environment: exactly the lock, then the wheel; nothing else.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check"]
    # --no-compile: the same files, without byte-compiling torch and Ray (a minute on 2 cores).
    lock = ["--quiet", "--no-compile", "--require-hashes", "--no-deps", "-r"]
    lock.append(str(ROOT / "requirements.lock"))
    _run([*pip, "install", *lock])
    _run([*pip, "install", "--quiet", "--no-compile", "--no-deps", str(wheel)])
    _run([*pip, "check"])

    # The main job, from a folder that is not the checkout.
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    env = _clean_environment(home)
    cli = str(venv / "bin/piserini-ray")
    version = _run([cli, "--version"], cwd=elsewhere, env=env).stdout.split()
    assert version == ["piserini-ray", "0.1.0"]
    _run([cli, "run"], cwd=elsewhere, env=env, timeout=900)
    # The same run as this checkout names: identity does not depend on where the code lies.
    (run_dir,) = (home / "runs").iterdir()
    assert run_dir.name == default_run_dir(load_config(), home / "runs").name
    records = [orjson.loads(line) for line in (run_dir / "records.jsonl").read_bytes().splitlines()]
    assert len(records) == 100 and {r["status"] for r in records} == {"completed"}
    manifest = orjson.loads((run_dir / "manifest.json").read_bytes())
    assert manifest["versions"]["piserini_ray"] == "0.1.0"
    # Priced by the table the installed package carries.
    table = venv / "lib/python3.11/site-packages/piserini_ray/pricing.yaml"
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert set(summary["pricing_source"].values()) == {f"table {table}"}
    assert summary["statuses"] == {"completed": 100}

    # And the report of that run, made again by the installed command.
    report = _run([cli, "report", str(run_dir)], cwd=elsewhere, env=env).stdout
    assert f"| {run_dir} | offline/heuristic | offline/exact-match-judge | 100 |" in report
