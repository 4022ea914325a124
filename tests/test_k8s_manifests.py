"""The KubeRay manifests of `jobs/k8s/` as Kubernetes would take them, and what they promise.

- Each `spec` is valid against KubeRay's own CRD schema (the `v1` OpenAPI v3 schema of the
  CRDs in `tests/fixtures/kuberay/`, with their origin and licence), read as the API server
  reads a structural schema: a field that an object's schema does not name is an error
  (`additionalProperties: false` for every object without
  `x-kubernetes-preserve-unknown-fields`), `nullable` allows null, and the entries of a
  `x-kubernetes-list-type: map` list are unique by their keys (of a `set`, unique). The CEL
  rules (`x-kubernetes-validations`) are not evaluated: no field the manifests set has one.
- Every `piserini-ray SUBCOMMAND --flag` written anywhere in `jobs/k8s/` parses with the
  package's own parser, and every `ray start` / `ray job submit` (the ones written out and the
  ones KubeRay builds from `rayStartParams`) with Ray's.
- No secret value is written anywhere: keys and the Ray token come from Secrets by
  `secretKeyRef`, the keys to the driver's node only, the token to every Ray container.
- Ray runs with token auth, sized (requests, `num-cpus`, object store), with a volume for
  `PISERINI_RAY_HOME` on every pod, from an image built from this repository.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import hashlib
import io
import json
import re
import shlex
import tomllib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import FIXTURES

from piserini_ray.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "jobs" / "k8s"
CRDS = FIXTURES / "kuberay"
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
TOKEN_SECRET = "piserini-ray-auth"
KEYS_SECRET = "piserini-ray-keys"
DRIVER_RESOURCE = "piserini_driver"
HOME = "/home/ray/piserini_ray_home"
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# --- the validator: a structural schema as the API server applies it -----------------------


def structural(node: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI v3 schema node in which every object that does not preserve unknown
    fields takes no field its schema does not name (what the API server's strict field
    validation rejects and its pruning drops), and `nullable` admits null."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: structural(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = structural(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [structural(sub) for sub in value]
        else:
            out[key] = value
    is_object = node.get("type") == "object" or "properties" in node
    preserves = node.get("x-kubernetes-preserve-unknown-fields") is True
    if is_object and not preserves and "additionalProperties" not in node:
        out["additionalProperties"] = False
    if node.get("nullable") is True and isinstance(node.get("type"), str):
        out["type"] = [node["type"], "null"]
    return out


def _list_type(
    validator: Any, list_type: str, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """`x-kubernetes-list-type`: a `map` list holds one entry per key (a missing key takes its
    default, as the API server defaults it first), a `set` list no item twice."""
    if not validator.is_type(instance, "array"):
        return
    if list_type == "set":
        seen_items: set[str] = set()
        for item in instance:
            encoded = json.dumps(item, sort_keys=True)
            if encoded in seen_items:
                yield jsonschema.ValidationError(f"duplicate item {item!r} in a set list")
            seen_items.add(encoded)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        fields = schema.get("items", {}).get("properties", {})
        seen: set[str] = set()
        for item in instance:
            if not isinstance(item, dict):
                continue
            key = {k: item.get(k, fields.get(k, {}).get("default")) for k in keys}
            encoded = json.dumps(key, sort_keys=True)
            if encoded in seen:
                yield jsonschema.ValidationError(f"duplicate entry for {key} in a map list")
            seen.add(encoded)


StrictValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type}
)


def crd_spec_schema(kind: str) -> dict[str, Any]:
    """The `spec` schema of `kind` in KubeRay's CRD, version v1, as published."""
    crd = yaml.load(_crd_text(kind), Loader=Loader)
    assert crd["spec"]["names"]["kind"] == kind
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _crd_text(kind: str) -> str:
    return gzip.decompress((CRDS / f"{CRD_FILES[kind]}.gz").read_bytes()).decode()


def test_the_crds_are_kuberays_as_published() -> None:
    """The vendored CRDs are the files SOURCE.md names, byte for byte (its SHA-256s)."""
    source = (CRDS / "SOURCE.md").read_text()
    assert "Apache License 2.0" in source and "ray-project/kuberay" in source
    for kind, name in CRD_FILES.items():
        digest = hashlib.sha256(_crd_text(kind).encode()).hexdigest()
        assert f"`{name}`: `{digest}`" in source, f"{name} differs from the file SOURCE.md names"


def errors(validator: Any, spec: dict[str, Any]) -> list[str]:
    found = sorted(validator.iter_errors(spec), key=lambda e: list(map(str, e.absolute_path)))
    return [".".join(["spec", *map(str, e.absolute_path)]) + f": {e.message}" for e in found]


def cel_fields(schema: dict[str, Any], instance: Any, path: str = "spec") -> Iterator[str]:
    """Fields set in `instance` whose schema carries CEL rules (which this test does not run)."""
    if schema.get("x-kubernetes-validations"):
        yield path
    if isinstance(instance, dict):
        for name, value in instance.items():
            if name in schema.get("properties", {}):
                yield from cel_fields(schema["properties"][name], value, f"{path}.{name}")
            elif isinstance(schema.get("additionalProperties"), dict):
                yield from cel_fields(schema["additionalProperties"], value, f"{path}.{name}")
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(instance):
            yield from cel_fields(schema["items"], value, f"{path}[{i}]")


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict[str, Any]]:
    return {kind: crd_spec_schema(kind) for kind in CRD_FILES}


@pytest.fixture(scope="module")
def validators(schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {kind: StrictValidator(structural(schema)) for kind, schema in schemas.items()}


# --- the manifests -----------------------------------------------------------------------


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def ray_documents() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in documents() if doc.get("apiVersion") == "ray.io/v1"]


def manifest(kind: str) -> dict[str, Any]:
    (doc,) = [doc for _, doc in ray_documents() if doc["kind"] == kind]
    return doc


def cluster_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def pods(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, str] | None]]:
    """(role, pod spec, rayStartParams) of every pod template: `head`, `worker:GROUP` and, for
    a RayJob, `submitter` (whose Ray node, if any, is started by its own command)."""
    cluster = cluster_spec(doc)
    head = cluster["headGroupSpec"]
    yield "head", head["template"]["spec"], head["rayStartParams"]
    for group in cluster.get("workerGroupSpecs", []):
        yield f"worker:{group['groupName']}", group["template"]["spec"], group["rayStartParams"]
    if "submitterPodTemplate" in doc["spec"]:
        yield "submitter", doc["spec"]["submitterPodTemplate"]["spec"], None


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def shell_text(container: dict[str, Any]) -> str:
    """What a container runs, as shell text: the script of `bash -c`, else its argv."""
    command, args = container.get("command", []), container.get("args", [])
    if command and Path(command[0]).name in ("bash", "sh") and "-c" in command:
        return "\n".join(args)
    return shlex.join([*command, *args])


def starts_ray(container: dict[str, Any]) -> bool:
    return bool(re.search(r"\bray start\b", shell_text(container)))


def ray_containers(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Containers that run a Ray node: the Ray container of each group (KubeRay starts Ray in
    the first one) and any container whose own command starts Ray."""
    for role, pod, params in pods(doc):
        for i, container in enumerate(pod["containers"]):
            if (params is not None and i == 0) or starts_ray(container):
                yield role, container
        for container in pod.get("initContainers", []):
            if starts_ray(container):
                yield role, container


def env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def secret_ref(entry: dict[str, Any]) -> tuple[str, str] | None:
    ref = entry.get("valueFrom", {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None


# --- commands ----------------------------------------------------------------------------


def _logical_lines(text: str) -> Iterator[str]:
    """Lines with `\\` continuations joined (a comment's continuation loses its `#`)."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending and line.startswith("#"):
            line = line[1:].strip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _segments(text: str) -> Iterator[list[str]]:
    """Simple shell commands of `text`: split at `;`, `&&`, `||`, `|`, `&` and parentheses,
    without a leading `exec`, variable assignments or a path before the program's name."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= set(";&|()<>"):
            while words and (words[0] == "exec" or re.match(r"^[A-Z_][A-Z0-9_]*=", words[0])):
                words.pop(0)
            if words:
                yield [Path(words[0]).name, *words[1:]]
            words = []
        else:
            words.append(token)


def piserini_error(argv: list[str]) -> str | None:
    """Why `piserini-ray ARGV` would not parse with the package's own parser, or None."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            build_parser().parse_args(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):  # --help exits 0
            return f"piserini-ray {shlex.join(argv)}: {out.getvalue().strip()}"
    return None


def ray_error(argv: list[str], mention: bool = False) -> str | None:
    """Why `ray ARGV` would not parse with Ray's own command line, or None. A `mention` (a
    command quoted in prose) may leave out required arguments, never name a wrong option."""
    import click

    with warnings.catch_warnings():  # Ray's command line imports Serve's pydantic models
        warnings.simplefilter("ignore")
        from ray.scripts.scripts import cli

    command: click.Command = cli
    args = list(argv)
    name = "ray"
    while isinstance(command, click.Group):
        if not args or args[0] not in command.commands:
            return f"ray {shlex.join(argv)}: no such command"
        name, *args = args
        command = command.commands[name]
    try:
        command.make_context(name, args)
    except click.MissingParameter as error:
        return None if mention else f"ray {shlex.join(argv)}: {error.format_message()}"
    except click.ClickException as error:
        return f"ray {shlex.join(argv)}: {error.format_message()}"
    return None


class Command(list[str]):
    """The words of one command; `mention`: quoted in prose (`ray up`), not a full command."""

    mention = False


def _command(words: list[str], mention: bool) -> Command:
    command = Command(words)
    command.mention = mention
    return command


def commands_in(text: str) -> Iterator[Command]:
    """Every `piserini-ray ...` and `ray ...` command written in `text` (shell or YAML, prose
    that quotes one in backticks), the entrypoint of a `ray job submit` included."""
    for line in _logical_lines(text):
        body = line.lstrip("#").strip()
        quoted = re.findall(r"`((?:\S*/)?(?:piserini-ray|ray)[ \t][^`]*)`", body)
        if quoted:
            body = "; ".join(quoted)
        elif not re.search(r"(^|[\s;&|(])(\S*/)?(piserini-ray|ray)[ \t]+[a-z]", body):
            continue
        body = re.sub(r"^(-\s+)?[\w.-]+:\s+(?=\S)", "", body)  # a YAML `key: value` line
        body = re.sub(r"^-\s+", "", body)  # a YAML list item
        body = re.sub(r"\s#.*$", "", body)  # a trailing comment
        try:
            segments = list(_segments(body))
        except ValueError as error:  # a command line that does not even tokenize
            yield _command(["unparseable", f"{line!r}: {error}"], False)
            continue
        for words in segments:
            if words[0] in ("ray", "piserini-ray"):
                yield _command(words, bool(quoted))
            if words[:3] == ["ray", "job", "submit"] and "--" in words:
                entry = words[words.index("--") + 1 :]
                if entry and Path(entry[0]).name in ("ray", "piserini-ray"):
                    yield _command([Path(entry[0]).name, *entry[1:]], bool(quoted))


def command_error(words: list[str]) -> str | None:
    if words[0] == "unparseable":
        return words[1]
    if words[0] == "piserini-ray":
        return piserini_error(words[1:])
    return ray_error(words[1:], mention=getattr(words, "mention", False))


def generated_ray_start(doc: dict[str, Any]) -> Iterator[list[str]]:
    """The `ray start` KubeRay builds for each group: `--KEY=VALUE` for every rayStartParams
    entry, through the shell (values are quoted as the manifest quotes them)."""
    for role, _, params in pods(doc):
        if params is None:
            continue
        head = ["--head"] if role == "head" else ["--address=head-svc:6379"]
        flags = " ".join(f"--{key}={value}" for key, value in params.items())
        yield ["ray", "start", *head, *shlex.split(flags), "--block"]


def manifest_commands(doc: dict[str, Any]) -> Iterator[list[str]]:
    if doc["kind"] == "RayJob":
        yield from commands_in(doc["spec"]["entrypoint"])
    for _, pod, _ in pods(doc):
        for container in containers(pod):
            yield from commands_in(shell_text(container))
    yield from generated_ray_start(doc)


# --- schema ------------------------------------------------------------------------------


def test_the_manifests_are_one_rayjob_and_one_raycluster_of_ray_io_v1() -> None:
    kinds = sorted(doc["kind"] for _, doc in ray_documents())
    assert kinds == ["RayCluster", "RayJob"]
    others = {doc["kind"] for _, doc in documents()} - {"RayCluster", "RayJob"}
    # storage.yaml and networkpolicy.yaml; no Secret is ever written here
    assert others == {"PersistentVolumeClaim", "NetworkPolicy"}


@pytest.mark.parametrize("name,doc", ray_documents(), ids=[n for n, _ in ray_documents()])
def test_each_spec_is_valid_against_kuberays_crd(
    name: str, doc: dict[str, Any], schemas: dict[str, Any], validators: dict[str, Any]
) -> None:
    found = errors(validators[doc["kind"]], doc["spec"])
    assert not found, f"{name} is not what KubeRay's CRD accepts:\n" + "\n".join(found)
    unchecked = list(cel_fields(schemas[doc["kind"]], doc["spec"]))
    assert not unchecked, f"{name} sets fields with CEL rules this test does not run: {unchecked}"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(doc["metadata"]) == {"name"}


def _add(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value

    return change


def _drop_container_name(spec: dict[str, Any]) -> None:
    del spec["headGroupSpec"]["template"]["spec"]["containers"][0]["name"]


def _duplicate_env(spec: dict[str, Any]) -> None:
    container = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "RAY_AUTH_MODE", "value": "disabled"})


BROKEN = [
    # (kind, change, what the API server says)
    ("RayJob", _add("rayClusterSpec.headGroupSpec.bogus", 1), "unknown field"),
    ("RayJob", _add("bogus", 1), "unknown field at the top of spec"),
    ("RayJob", _add("submitterPodTemplate.spec.initContainers.0.comand", ["x"]), "typo"),
    ("RayJob", _add("rayClusterSpec.authOptions.mode", "tokens"), "not in the enum"),
    ("RayCluster", _add("headGroupSpec.bogus", 1), "unknown field"),
    ("RayCluster", _add("headGroupSpec.template.spec.containers.0.resources.request", {}), "typo"),
    ("RayCluster", _add("headGroupSpec.template.metadata", {"lables": {}}), "typo"),
    ("RayCluster", _add("workerGroupSpecs.1.rayStartParams.num-cpus", 4), "a number, not a string"),
    ("RayCluster", _drop_container_name, "a required field missing"),
    ("RayCluster", _duplicate_env, "two env entries of one name"),
]


@pytest.mark.parametrize("kind,change,why", BROKEN, ids=[f"{k}: {w}" for k, _, w in BROKEN])
def test_the_validator_rejects_what_the_api_server_rejects(
    kind: str,
    change: Callable[[dict[str, Any]], None],
    why: str,
    validators: dict[str, Any],
) -> None:
    spec = copy.deepcopy(manifest(kind)["spec"])
    change(spec)
    assert errors(validators[kind], spec), f"a {kind} spec with {why} was accepted"


def test_strictness_is_the_validators_own(schemas: dict[str, Any]) -> None:
    """The published schema alone (plain JSON Schema) lets an unknown field through: rejecting
    it is the structural reading above, as the API server does."""
    spec = copy.deepcopy(manifest("RayJob")["spec"])
    spec["rayClusterSpec"]["headGroupSpec"]["bogus"] = 1
    assert not list(jsonschema.Draft4Validator(schemas["RayJob"]).iter_errors(spec))
    strict = StrictValidator(structural(schemas["RayJob"]))
    assert any("bogus" in e for e in errors(strict, spec))


# --- commands ----------------------------------------------------------------------------


def test_every_command_written_in_jobs_k8s_parses_with_its_own_cli() -> None:
    written = [
        (path.name, words)
        for path in sorted(K8S.iterdir())
        if path.is_file()
        for words in commands_in(path.read_text())
    ]
    from_specs = [
        (name, words) for name, doc in ray_documents() for words in manifest_commands(doc)
    ]
    found = written + from_specs
    broken = [f"{name}: {error}" for name, words in found if (error := command_error(words))]
    assert not broken, "\n".join(broken)
    runs = [w for _, w in found if w[:2] == ["piserini-ray", "run"] and "--config" in w]
    assert {name for name, w in found if w in runs} >= {"rayjob.yaml", "raycluster.yaml"}


@pytest.mark.parametrize(
    "words",
    [
        ["piserini-ray", "serve", "--config", "x.yaml"],  # no such subcommand
        ["piserini-ray", "run", "--configs", "x.yaml"],  # no such flag
        ["ray", "start", "--num-cpu=0"],
        _command(["ray", "up", "--bogus"], mention=True),  # quoted in prose, still checked
        ["ray", "job", "sumbit", "--", "piserini-ray", "run"],
    ],
    ids=" ".join,
)
def test_a_command_the_cli_does_not_have_fails(words: list[str]) -> None:
    assert command_error(words)


def test_the_job_runs_the_main_job_on_the_drivers_node() -> None:
    job = manifest("RayJob")["spec"]
    assert shlex.split(job["entrypoint"])[:2] == ["piserini-ray", "run"]
    assert json.loads(job["entrypointResources"]) == {DRIVER_RESOURCE: 1}
    assert "runtimeEnvYAML" not in job  # a job's runtime_env shows in the dashboard
    (submitter,) = job["submitterPodTemplate"]["spec"]["containers"]
    assert "command" not in submitter  # KubeRay's own submit (with its retry guard)
    (node,) = job["submitterPodTemplate"]["spec"]["initContainers"]
    assert node["restartPolicy"] == "Always"  # a sidecar: lives as long as the submitter
    (start,) = [w for w in commands_in(shell_text(node)) if w[:2] == ["ray", "start"]]
    head = f"--address={manifest('RayJob')['metadata']['name']}-head-svc:6379"
    assert head in start and "--num-cpus=0" in start and "--block" in start
    submit = [
        w
        for w in commands_in((K8S / "raycluster.yaml").read_text())
        if w[:3] == ["ray", "job", "submit"]
    ]
    assert submit and all(
        json.loads(w[w.index("--entrypoint-resources") + 1]) == {DRIVER_RESOURCE: 1} for w in submit
    )


# --- secrets, keys, token ----------------------------------------------------------------

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
SECRET_VALUE = re.compile(
    r"sk-[A-Za-z0-9_-]{16,}|sk-ant-|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|xox[abposr]-|\b[0-9a-fA-F]{32,}\b|-----BEGIN"
)


def test_no_secret_value_is_written_anywhere_in_jobs_k8s() -> None:
    for path in sorted(p for p in K8S.rglob("*") if p.is_file() and p.suffix != ".whl"):
        found = SECRET_VALUE.findall(path.read_text())
        assert not found, f"{path.name} holds what looks like a secret: {found}"
    for name, doc in ray_documents():
        for role, pod, _ in pods(doc):
            for container in containers(pod):
                where = f"{name} {role} {container['name']}"
                assert "envFrom" not in container, f"{where}: envFrom (only secretKeyRef)"
                for variable, entry in env(container).items():
                    if SECRET_NAME.search(variable):
                        assert "value" not in entry and secret_ref(entry), (
                            f"{where}: {variable} must come from a Secret by secretKeyRef"
                        )


def _driver_node(container: dict[str, Any], params: dict[str, str] | None) -> bool:
    """A Ray node that takes no CPU work and offers the driver's resource."""
    if params is not None and container.get("command") is None:
        resources = json.loads(params.get("resources", "{}").strip("'\""))
        return params.get("num-cpus") == "0" and resources == {DRIVER_RESOURCE: 1}
    (start,) = [w for w in commands_in(shell_text(container)) if w[:2] == ["ray", "start"]]
    resources = next(a for a in start if a.startswith("--resources="))
    return "--num-cpus=0" in start and json.loads(resources.split("=", 1)[1]) == {
        DRIVER_RESOURCE: 1
    }


@pytest.mark.parametrize("kind", ["RayJob", "RayCluster"])
def test_keys_reach_the_drivers_node_only(kind: str) -> None:
    holders = []
    for role, pod, params in pods(manifest(kind)):
        for i, container in enumerate(containers(pod)):
            keys = [
                v for v, e in env(container).items() if (secret_ref(e) or ("",))[0] == KEYS_SECRET
            ]
            if keys:
                assert role != "head", f"keys in the head: {keys}"
                group_params = params if container is pod["containers"][0] else None
                assert _driver_node(container, group_params), f"keys in {role} {i}: {keys}"
                assert "OPENAI_API_KEY" in keys
                holders.append(role)
    assert len(holders) == 1, f"the keys must be in exactly one container, not {holders}"


@pytest.mark.parametrize("kind", ["RayJob", "RayCluster"])
def test_ray_runs_with_token_auth_from_the_secret(kind: str) -> None:
    doc = manifest(kind)
    cluster = cluster_spec(doc)
    assert cluster["authOptions"] == {"mode": "token", "secretName": TOKEN_SECRET}
    assert cluster["rayVersion"] == _ray_version()
    nodes = list(ray_containers(doc))
    assert {role for role, _ in nodes} >= {"head", "worker:cpu"}
    for role, container in nodes:
        variables = env(container)
        assert variables["RAY_AUTH_MODE"].get("value") == "token", role
        assert secret_ref(variables["RAY_AUTH_TOKEN"]) == (TOKEN_SECRET, "auth_token"), role


def test_the_long_lived_clusters_dashboard_stays_on_the_heads_loopback() -> None:
    head = manifest("RayCluster")["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    for kind in ("RayJob", "RayCluster"):  # never exposed outside the Kubernetes cluster
        head = cluster_spec(manifest(kind))["headGroupSpec"]
        assert head["serviceType"] == "ClusterIP" and head["enableIngress"] is False


# --- sizing, volumes, image ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["RayJob", "RayCluster"])
def test_every_pod_is_sized_and_has_a_volume_for_piserini_ray_home(kind: str) -> None:
    claims = {
        doc["metadata"]["name"]: doc
        for _, doc in documents()
        if doc["kind"] == "PersistentVolumeClaim"
    }
    for role, pod, params in pods(manifest(kind)):
        for container in containers(pod):
            where = f"{kind} {role} {container['name']}"
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where
        volumes = {v["name"]: v for v in pod["volumes"]}
        for volume in volumes.values():
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            assert claim is None or claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"]
        if params is not None:
            assert {"num-cpus", "object-store-memory"} <= set(params), f"{kind} {role}"
    for role, container in ray_containers(manifest(kind)):
        where = f"{kind} {role} {container['name']}"
        assert env(container)["PISERINI_RAY_HOME"]["value"] == HOME, where
        pod = next(p for r, p, _ in pods(manifest(kind)) if r == role)
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mounts[HOME]]["persistentVolumeClaim"]["claimName"] == "piserini-ray-home"
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", where
        if container.get("command"):
            (start,) = [w for w in commands_in(shell_text(container)) if w[:2] == ["ray", "start"]]
            assert any(a.startswith("--object-store-memory=") for a in start), where
            assert any(a.startswith("--num-cpus=") for a in start), where


def _ray_version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(d for d in project["dependencies"] if d.startswith("ray[")).split("==")[1]


def test_every_pod_runs_the_image_built_from_this_repository() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    image = f"piserini-ray:{project['version']}"
    used = {
        container["image"]
        for _, doc in ray_documents()
        for _, pod, _ in pods(doc)
        for container in containers(pod)
    }
    assert used == {image}
    dockerfile = (K8S / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    assert base == f"rayproject/ray:{_ray_version()}-py311-cpu"
    # Exactly the lock, with its hashes, and no other index; then the wheel of this tree.
    assert re.search(r"pip install .*--require-hashes .*\n?.*-r requirements\.lock", dockerfile)
    assert "index-url" not in dockerfile and "--index" not in dockerfile
    assert re.search(r"pip wheel --no-deps .* \.", dockerfile)
    assert "pip install --no-cache-dir --no-deps dist/piserini_ray-*.whl" in dockerfile
    assert f"-t {image} ." in dockerfile


# --- the network policy --------------------------------------------------------------------

#: networking.k8s.io/v1 NetworkPolicy as the API reference gives it (the fields this project
#: may use), strict: a misspelt field is an error, as the API server's strict validation makes it.
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}
_PEER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"podSelector": _SELECTOR, "namespaceSelector": _SELECTOR, "ipBlock": {}},
}
_PORT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
        "port": {"type": ["integer", "string"]},
        "endPort": {"type": "integer"},
    },
}
NETWORK_POLICY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "networking.k8s.io/v1"},
        "kind": {"const": "NetworkPolicy"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["podSelector"],
            "properties": {
                "podSelector": _SELECTOR,
                "policyTypes": {"type": "array", "items": {"enum": ["Ingress", "Egress"]}},
                "ingress": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "from": {"type": "array", "items": _PEER},
                            "ports": {"type": "array", "items": _PORT},
                        },
                    },
                },
                "egress": {"type": "array"},
            },
        },
    },
}
CLUSTER_LABEL = "piserini-ray/cluster"
OPERATOR = {"app.kubernetes.io/name": "kuberay-operator"}


def _pod_labels(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each pod template's labels, by role (`pods`)."""
    cluster = cluster_spec(doc)
    templates = {"head": cluster["headGroupSpec"]["template"]}
    for group in cluster.get("workerGroupSpecs", []):
        templates[f"worker:{group['groupName']}"] = group["template"]
    if "submitterPodTemplate" in doc["spec"]:
        templates["submitter"] = doc["spec"]["submitterPodTemplate"]
    return {role: t.get("metadata", {}).get("labels", {}) for role, t in templates.items()}


def _policies() -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == "NetworkPolicy"]


def test_each_network_policy_is_valid() -> None:
    validator = jsonschema.Draft202012Validator(NETWORK_POLICY)
    for policy in _policies():
        assert not list(validator.iter_errors(policy)), policy["metadata"]["name"]
        for selector in [policy["spec"]["podSelector"]]:
            for key, value in selector["matchLabels"].items():
                prefix, _, name = key.rpartition("/")
                assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", prefix) and name
                assert re.fullmatch(r"[A-Za-z0-9]([-_.A-Za-z0-9]{0,61}[A-Za-z0-9])?", value)
    broken = copy.deepcopy(_policies()[0])
    broken["spec"]["ingress"][0]["form"] = broken["spec"]["ingress"][0].pop("from")
    assert list(validator.iter_errors(broken))  # the check is not a formality


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_only_the_clusters_own_pods_reach_rays_ports(kind: str) -> None:
    """Every pod of the cluster (the RayJob's submitter too: its sidecar is a Ray node) carries
    one label; one policy selects exactly those pods, admits from them on every port, and from
    nothing else but the KubeRay operator on the dashboard's port (the RayJob's operator submits
    and polls the job there)."""
    doc = manifest(kind)
    labels = _pod_labels(doc)
    values = {role: found.get(CLUSTER_LABEL) for role, found in labels.items()}
    (value,) = set(values.values())
    assert value is not None, values
    (policy,) = [
        p for p in _policies() if p["spec"]["podSelector"]["matchLabels"] == {CLUSTER_LABEL: value}
    ]
    assert "Ingress" in policy["spec"]["policyTypes"]
    own = {"podSelector": {"matchLabels": {CLUSTER_LABEL: value}}}
    rules = policy["spec"]["ingress"]
    assert rules[0] == {"from": [own]}
    for rule in rules[1:]:  # the operator, to the dashboard only
        assert kind == "RayJob" and rule["ports"] == [{"protocol": "TCP", "port": 8265}]
        ((peer),) = rule["from"]
        assert peer["podSelector"] == {"matchLabels": OPERATOR}
    others = [p for p in _policies() if p["metadata"]["name"] != policy["metadata"]["name"]]
    assert all(p["spec"]["podSelector"]["matchLabels"][CLUSTER_LABEL] != value for p in others)
