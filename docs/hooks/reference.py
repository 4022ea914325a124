"""MkDocs hook: the configuration and CLI references, generated when the site is built.

`docs/reference/configuration.md` and `docs/reference/cli.md` hold a marker line that this hook
replaces with tables generated from the code itself, so the pages cannot drift and no generated
output is committed:

- the configuration reference walks `piserini_ray.config.RunConfig` and every pydantic model
  nested in it, by introspection (`model_fields`), never by naming classes or modules: a model
  that moves to another module is still found. A field's description is its
  `Field(description=...)`, else the `#:` comment block above it (or its trailing `# ...`
  comment) in the model's source; a section starts with its model's docstring;
- the CLI reference walks `piserini_ray.cli.build_parser()`: every subcommand (and nested
  subcommand), its usage, and each argument with its value, default and help.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import html
import inspect
import io
import json
import os
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

#: Read a field's description from its `#:` / trailing comment when it has no
#: `Field(description=...)`. False: such fields get an empty description (the section still
#: starts with its model's docstring).
FIELD_COMMENTS = True

CONFIG_MARKER = "<!-- piserini-ray: config-reference -->"
CLI_MARKER = "<!-- piserini-ray: cli-reference -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the markers with the generated references (mkdocs calls this for every page)."""
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


# --- text -------------------------------------------------------------------------------------


def _text(text: str) -> str:
    """Docstring or help text as markdown: code spans kept; outside them, HTML escaped."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: treat it as text
        parts = [text.replace("`", "&#96;")]
    for i in range(0, len(parts), 2):
        parts[i] = html.escape(parts[i], quote=False)
    return "`".join(parts)


def _cell(text: str) -> str:
    """Text for a markdown table cell: one line, pipes outside code spans escaped."""
    parts = _text(text.replace("\n", " ")).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|")
    return "`".join(parts)


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _anchor(prefix: str, name: str) -> str:
    slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()).strip("-")
    return f"{prefix}-{slug or 'top'}"


# --- the configuration reference ----------------------------------------------------------------


def config_reference() -> str:
    from piserini_ray.config import RunConfig

    sections = list(_walk(RunConfig, "", ()))
    out: list[str] = ["## Sections", ""]
    for path, cls, _ in sections:
        if path:
            depth = path.count(".")
            out.append(f"{'    ' * depth}- [{_code(path)}](#{_section_anchor(path, cls)})")
    out.append("")
    for path, cls, recursive in sections:
        out.extend(_section(path, cls, recursive))
    return "\n".join(out)


def _walk(cls: type[BaseModel], path: str, ancestors: tuple) -> Iterator[tuple]:
    """(path, model, whether it recurses) in document order, depth first. A model is documented
    at every path it is reachable by (`judge.model` repeats `model`), so every key can be
    looked up by its full path; a model inside itself is named, not expanded."""
    recursive = cls in ancestors
    yield path, cls, recursive
    if recursive:
        return
    for name, field in cls.model_fields.items():
        for nested in _models_in(field.annotation):
            yield from _walk(nested, f"{path}.{name}" if path else name, (*ancestors, cls))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation refers to (`X`, `X | None`, `list[X]`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def _section_anchor(path: str, cls: type) -> str:
    """A section's id: its path, and its model's name when the key takes several models."""
    parent, _, name = path.rpartition(".")
    if parent or name:
        owner = _model_at(parent)
        if owner is not None and len(_models_in(owner.model_fields[name].annotation)) > 1:
            return _anchor("config", f"{path}-{cls.__name__}")
    return _anchor("config", path)


def _model_at(path: str) -> type[BaseModel] | None:
    """The model whose fields are at `path` ("" is `RunConfig`); None when several are."""
    from piserini_ray.config import RunConfig

    model: type[BaseModel] = RunConfig
    for name in filter(None, path.split(".")):
        nested = _models_in(model.model_fields[name].annotation)
        if len(nested) != 1:
            return None
        model = nested[0]
    return model


def _section(path: str, cls: type, recursive: bool) -> list[str]:
    level = "##" if path.count(".") == 0 else "###"
    title = _code(path) if path else "The top level"
    out = [f"{level} {title} {{#{_section_anchor(path, cls)}}}", ""]
    if recursive:
        return [*out, f"A {_code(cls.__name__)} again, as documented above.", ""]
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    out += [f"*{cls.__name__}*" + (f": {_text(doc)}" if doc else ""), ""]
    comments = _field_comments(cls) if FIELD_COMMENTS else {}
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in cls.model_fields.items():
        key = f"{path}.{name}" if path else name
        description = field.description or comments.get(name, "")
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        notes = "; ".join(f"{k}: {v}" for k, v in extra.items())
        description = "; ".join(x for x in (description, notes) if x)
        out.append(
            f"| {_code(key)} | {_type_cell(field, key)} | {_default(field)} "
            f"| {_cell(description)} |"
        )
    out.append("")
    return out


def _type_cell(field: FieldInfo, key: str) -> str:
    text = _type(field.annotation, key)
    constraints = _constraints(field)
    return text + (f" ({constraints})" if constraints else "")


def _type(tp: Any, key: str) -> str:
    """A type in words; a nested model links to its section (the one at `key`)."""
    if tp is type(None):
        return "`null`"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{_code(tp.__name__)}](#{_section_anchor(key, tp)})"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return _one_of([_code(json.dumps(a)) for a in args])
    if origin in (typing.Union, types.UnionType):
        return _one_of([_type(a, key) for a in args])
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type(args[0], key)}" if args else "`list`"
    if origin is dict:
        if args:
            return f"mapping of {_type(args[0], key)} to {_type(args[1], key)}"
        return "mapping"
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, PurePath):
        return "`path`"
    return _code(getattr(tp, "__name__", str(tp)))


def _one_of(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _constraints(field: FieldInfo) -> str:
    symbols = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    found: list[str] = []
    for meta in field.metadata:
        for attr, symbol in symbols.items():
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{symbol} {value}")
        for attr in ("min_length", "max_length", "multiple_of"):
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{attr.replace('_', ' ')} {value}")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            found.append(f"matches {_code(str(pattern))}")
    return ", ".join(found)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory that takes the validated data
            return "computed"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "its section's defaults"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str | PurePath):
        return _code(str(value)) if str(value) else '`""`'
    if isinstance(value, dict | list | tuple):
        return _code(json.dumps(value, default=str))
    return _code(repr(value))


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comments in the class source: the `#:` lines right above it, then its
    trailing `# ...` comment. Empty when the source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return {}
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    with contextlib.suppress(tokenize.TokenError):
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            line = token.start[0]
            if token.type == tokenize.COMMENT and lines[line - 1].strip() != token.string:
                trailing[line] = token.string.lstrip("#").strip()
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found: dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            above.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        text = " ".join(part for part in (" ".join(above), trailing.get(node.lineno, "")) if part)
        if text:
            found[node.target.id] = text
    return found


# --- the CLI reference ----------------------------------------------------------------------------


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """argparse wraps usage to the terminal's width: make it the same on every machine."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_reference() -> str:
    from piserini_ray.cli import build_parser

    with _columns(100):
        parser = build_parser()
        commands = list(_subcommands(parser))
        out = ["## Commands", "", "| command | what it does |", "|---|---|"]
        for sub, help_ in commands:
            out.append(f"| [{_code(sub.prog)}](#{_anchor('cli', sub.prog)}) | {_cell(help_)} |")
        out += ["", "## Usage", "", "```text", parser.format_usage().strip(), "```", ""]
        out += _arguments(parser)
        for sub, help_ in commands:
            out += _command(sub, help_)
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple]:
    """(parser, help) of every subcommand, nested ones after their parent, aliases once."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        done: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) in done:
                continue
            done.add(id(sub))
            yield sub, helps.get(name) or sub.description or ""
            yield from _subcommands(sub)


def _command(sub: argparse.ArgumentParser, help_: str) -> list[str]:
    out = [f"## {_code(sub.prog)} {{#{_anchor('cli', sub.prog)}}}", ""]
    if help_:
        out += [_cell(help_), ""]
    if sub.description and sub.description != help_:
        out += [_text(sub.description), ""]
    out += ["```text", sub.format_usage().strip(), "```", ""]
    return out + _arguments(sub)


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(
            action, argparse._HelpAction | argparse._SubParsersAction
        ):
            continue
        try:
            help_ = formatter._expand_help(action) if action.help else ""
        except (KeyError, TypeError, ValueError):
            help_ = action.help or ""
        name = ", ".join(action.option_strings) or action.metavar or action.dest
        rows.append(
            f"| {_code(str(name))} | {_value(action)} | {_arg_default(action)} | {_cell(help_)} |"
        )
    if not rows:
        return []
    return ["| argument | value | default | help |", "|---|---|---|---|", *rows, ""]


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "flag"
    if action.choices is not None:
        text = _one_of([_code(str(c)) for c in action.choices])
    elif action.metavar is not None:
        text = _code(str(action.metavar))
    elif action.type is not None:
        text = _code(getattr(action.type, "__name__", str(action.type)).lower())
    else:
        text = "`str`"
    many = {"+": "one or more of ", "*": "any number of ", "?": "optional "}
    if isinstance(action.nargs, str) and action.nargs in many:
        text = many[action.nargs] + text
    elif isinstance(action.nargs, int) and action.nargs > 1:
        text = f"{action.nargs} x {text}"
    notes = []
    if isinstance(action, argparse._AppendAction):
        notes.append("repeatable")
    if action.required and action.option_strings:
        notes.append("required")
    return text + (f" ({', '.join(notes)})" if notes else "")


def _arg_default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default == argparse.SUPPRESS or action.nargs == 0:
        return ""
    return _code(str(default))
