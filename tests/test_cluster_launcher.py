"""`cluster.yaml` as Ray's cluster launcher reads it (`ray up` prepares, then validates against
Ray's own schema), and what it must promise: a pinned image with our Python and Ray, setup
that fails loudly, data and results outside the job's working dir, Ray with token auth (the
token from the machine that runs `ray up`, never in the file), the dashboard on the head's
loopback, no key on any node, and commands that parse with the CLIs they name."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from test_k8s_manifests import SECRET_VALUE, command_error, commands_in

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared() -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    config = prepare_config(raw)  # what `ray up` does before it validates
    validate_config(config)  # ray/autoscaler/ray-schema.json, then Ray's own checks
    return config


def test_cluster_yaml_passes_rays_own_validation(prepared: dict) -> None:
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    schema = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    assert schema.is_file()
    broken = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    broken["available_node_types"]["head"]["bogus_key"] = 1
    with pytest.raises(jsonschema.ValidationError):  # the check is not a formality
        validate_config(prepare_config(broken))
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_the_image_has_our_python_and_our_ray(prepared: dict) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ray_pin = next(d for d in project["dependencies"] if d.startswith("ray["))
    version = ray_pin.split("==")[1]
    assert project["requires-python"].startswith(">=3.11")
    assert prepared["docker"]["image"] == f"rayproject/ray:{version}-py311-cpu"
    assert "make setup PYTHON=python3.11" in " ".join(prepared["setup_commands"])


def test_no_setup_step_may_fail_quietly(prepared: dict) -> None:
    """Ray stops a node's setup at the first command that exits non-zero, unless the command
    swallows its own failure; Ray's defaults (which do) must not creep in either."""
    steps = [
        command
        for key in (
            "initialization_commands", "setup_commands", "head_setup_commands",
            "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
        )
        for command in prepared[key]
    ]  # fmt: skip
    swallowing = re.compile(r"\|\|\s*(true|:)\b|;\s*true\s*$|set\s+\+e|\|\|\s*echo")
    assert steps and not [s for s in steps if swallowing.search(s)]
    index = [s for s in prepared["setup_commands"] if "piserini-ray index" in s]
    assert len(index) == 1 and "configs/browsecomp-plus.yaml" in index[0]
    assert not [s for s in prepared["head_setup_commands"] if s.startswith("pip ")]


def test_data_and_results_stay_out_of_the_working_dir(prepared: dict) -> None:
    from piserini_ray.config import load_config

    mounts = prepared["file_mounts"]
    assert mounts["~/piserini_ray/piserini_ray"] == "./piserini_ray"
    assert "~/piserini_ray_data" in mounts
    config = load_config(ROOT / "configs" / "browsecomp-plus.yaml")
    data = Path("~/piserini_ray_data").expanduser()
    assert config.benchmark.corpus is not None and config.benchmark.corpus.is_relative_to(data)
    assert not {".venv", "runs", "data"} & {Path(source).name for source in mounts.values()}
    starts = prepared["head_start_ray_commands"] + prepared["worker_start_ray_commands"]
    assert all("PISERINI_RAY_HOME=~/piserini_ray_home" in s for s in starts if "ray start" in s)
    assert "~/piserini_ray_home/runs/" in (ROOT / "cluster.yaml").read_text()  # rsync-down


#: What a node needs of the checkout: the package, its build and lock, configs and job scripts.
NODE_NEEDS = {"piserini_ray", "configs", "jobs", "Makefile", "pyproject.toml", "requirements.lock",
              "README.md"}  # fmt: skip


def _synced(checkout: Path, prepared: dict) -> set[str]:
    """The files of `checkout` that `ray up` copies to a node: under each local mount source
    of the checkout, except what an `rsync_exclude` pattern matches (rsync matches a pattern
    without `/` against each path component's name)."""
    import fnmatch

    excludes = prepared["rsync_exclude"]
    found = set()
    for source in prepared["file_mounts"].values():
        if not source.startswith("."):
            continue  # the data folder and the token: not the checkout
        root = (checkout / source).resolve()
        for path in [root] if root.is_file() else root.rglob("*"):
            parts = path.relative_to(checkout).parts
            excluded = any(
                fnmatch.fnmatch(part, pattern.removeprefix("**/"))
                for part in parts
                for pattern in excludes
            )
            if path.is_file() and not excluded:
                found.add("/".join(parts))
    return found


def test_nodes_get_only_what_they_need_of_the_checkout(prepared: dict, tmp_path: Path) -> None:
    """An explicit list of what a node needs, and files named like secrets left out of it:
    a `.env` or a `*.pem` in the checkout travels to no node."""
    code = {k: v for k, v in prepared["file_mounts"].items() if v.startswith(".")}
    assert {Path(v).name for v in code.values()} == NODE_NEEDS
    assert all((ROOT / v).exists() for v in code.values())
    checkout = tmp_path / "checkout"
    for name in [*NODE_NEEDS, ".env", "deploy.pem", "runs/r/records.jsonl", ".git/config",
                 "piserini_ray/.env", "configs/.env.local", "jobs/k8s/tls.key",
                 "piserini_ray/__pycache__/x.pyc"]:  # fmt: skip
        folder = name in ("piserini_ray", "configs", "jobs")
        path = checkout / name / "x.py" if folder else checkout / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    synced = _synced(checkout, prepared)
    assert synced == {
        "Makefile", "pyproject.toml", "requirements.lock", "README.md",
        "piserini_ray/x.py", "configs/x.py", "jobs/x.py",
    }  # fmt: skip


COMMAND_LISTS = (
    "initialization_commands", "setup_commands", "head_setup_commands",
    "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
)  # fmt: skip


def _ray_starts(prepared: dict, key: str) -> list[str]:
    return [s for s in prepared[key] if re.search(r"\bray start\b", s)]


def test_ray_starts_with_token_auth_and_the_token_is_never_in_the_file(prepared: dict) -> None:
    starts = _ray_starts(prepared, "head_start_ray_commands") + _ray_starts(
        prepared, "worker_start_ray_commands"
    )
    assert len(starts) == 2
    for start in starts:  # the mode in the environment of every `ray start`
        assert re.match(r"export (\S+ )*RAY_AUTH_MODE=token[ &]", start), start
    # The token: the runner's own ~/.ray/auth_token, copied to Ray's default path on each node.
    assert prepared["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # Every shell on a node (the launcher's commands, `ray attach` for the driver) has the mode.
    assert any(
        "echo 'export RAY_AUTH_MODE=token' >> ~/.bashrc" in s for s in prepared["setup_commands"]
    )
    text = (ROOT / "cluster.yaml").read_text()
    assert not re.search(r"RAY_AUTH_TOKEN\s*=", text) and not SECRET_VALUE.findall(text)
    assert "RAY_AUTH_MODE=disabled" not in text


def test_the_dashboard_stays_on_the_heads_loopback(prepared: dict) -> None:
    (head,) = _ray_starts(prepared, "head_start_ray_commands")
    assert "--dashboard-host=127.0.0.1" in head.split()
    (worker,) = _ray_starts(prepared, "worker_start_ray_commands")
    assert "dashboard-host" not in worker


def test_no_node_gets_a_key(prepared: dict) -> None:
    """Keys reach the driver only (a shell on the head, see the file's header): no command the
    launcher runs on a node names a key variable, and no file it copies is a key file."""
    commands = " ".join(c for key in COMMAND_LISTS for c in prepared[key])
    assert not re.search(r"[A-Z0-9_]*(API_KEY|_KEY=|SECRET|PASSWORD)", commands)
    assert not [m for m in prepared["file_mounts"] if re.search(r"key|secret|\.env", m, re.I)]
    assert "ray attach cluster.yaml" in (ROOT / "cluster.yaml").read_text()


def test_every_command_in_the_file_parses_with_its_own_cli() -> None:
    found = list(commands_in((ROOT / "cluster.yaml").read_text()))
    assert {w[0] for w in found} == {"ray", "piserini-ray"}
    broken = [error for words in found if (error := command_error(words))]
    assert not broken, "\n".join(broken)
    runs = [w for w in found if w[:2] == ["piserini-ray", "run"]]
    assert runs and all("--config" in w for w in runs)  # the driver's run, in the header
