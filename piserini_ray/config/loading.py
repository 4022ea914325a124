"""Reading configs: a YAML file (or the defaults) with dotted overrides, relative paths taken
from the file's folder, model blocks from their own files, validated into a `RunConfig`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from piserini_ray.config.run import RunConfig
from piserini_ray.errors import ConfigError, describe_validation_error


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    """A YAML file holding a mapping, or a `ConfigError` naming the file and what is wrong."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{what} {path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x} at offset "
            f"{e.start}); save the file as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a mapping at the top level")
    return data


def load_config(path: Path | None = None, overrides: dict | None = None) -> RunConfig:
    """Read a YAML config (or the defaults), apply dotted overrides, and validate.

    Relative paths inside the file are taken relative to the file's folder. `model` (and
    `judge.model`) may name a YAML file holding the model block (`configs/models/`), relative
    to the config file's folder too.
    """
    data: dict = {}
    base = Path(path).resolve().parent if path is not None else Path.cwd()
    if path is not None:
        data = read_yaml(path, "config file")
        _resolve_relative_paths(data, base)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    for node, key in ((data, "model"), (data.get("judge") or {}, "model")):
        if isinstance(node.get(key), str):
            node[key] = read_yaml((base / node[key]).expanduser(), "model file")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        where = f"config file {path}" if path else "configuration"
        raise ConfigError(f"{where} is invalid: {describe_validation_error(e)}") from None


_PATH_KEYS = {
    "benchmark": ("queries", "corpus", "qrels_evidence", "qrels_gold"),
    "slice": ("ids_file",),
    "retrieval": ("index_root",),
    "retrieval.dense": ("encoder", "prebuilt_index"),
    "pricing": ("table",),
    "runtime": ("runs_root",),
}


def _resolve_relative_paths(data: dict, base: Path) -> None:
    for section, keys in _PATH_KEYS.items():
        node: Any = data
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for key in keys:
            value = node.get(key)
            if not isinstance(value, str):
                continue
            path = Path(value).expanduser()
            if key == "encoder" and not (path.is_absolute() or (base / path).exists()):
                continue  # a model name ("org/model"), looked up in the local model cache
            node[key] = str(path if path.is_absolute() else base / path)
