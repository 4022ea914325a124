"""MkDocs hook: the API reference and the record files' reference, generated when the site is
built (as `reference.py` generates the configuration and CLI references), so neither can drift:

- `docs/reference/api.md`: every name of `piserini_ray.__all__`, its signature and its
  docstring, whose `Args:`, `Returns:`, `Raises:` and `Example:` sections become a table, a
  paragraph, a table and a code block;
- `docs/reference/records.md`: every field of the files a run directory holds, walked from
  their pydantic models by introspection: `records.jsonl` (`QueryRecord`), the judgements
  (`Judgement`), `manifest.json` (`RunManifest`), `summary.json` (`RunMetrics`) and
  `epochs.json` (`EpochsReport`), and every model nested in them, each once.
"""

from __future__ import annotations

import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from reference import _cell, _code, _constraints, _default, _field_comments, _one_of, _text

API_MARKER = "<!-- piserini-ray: api-reference -->"
RECORDS_MARKER = "<!-- piserini-ray: records-reference -->"

#: The files of a run directory and the model of one of their lines (or of the whole file).
RECORD_FILES = (
    ("records.jsonl", "piserini_ray.records", "QueryRecord", "one line per query run"),
    (
        "judgements/<judge model>.jsonl",
        "piserini_ray.records",
        "Judgement",
        "one line per query judged, a file per judge model",
    ),
    ("manifest.json", "piserini_ray.records", "RunManifest", "the run's config and versions"),
    ("summary.json", "piserini_ray.reports.run_metrics", "RunMetrics", "the run's figures"),
    ("epochs.json", "piserini_ray.reports.epochs", "EpochsReport", "a run with several epochs"),
    (
        "decision.json",
        "piserini_ray.analysis.stopping",
        "Decision",
        "a run of a `stop_when_decided` sweep",
    ),
)

SECTIONS = ("Args", "Returns", "Raises", "Example")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the markers with the generated references (mkdocs calls this for every page)."""
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_reference())
    if RECORDS_MARKER in markdown:
        markdown = markdown.replace(RECORDS_MARKER, records_reference())
    return markdown


def _anchor(prefix: str, name: str) -> str:
    slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()).strip("-")
    return f"{prefix}-{slug}"


# --- the API reference ------------------------------------------------------------------------


def api_reference() -> str:
    import piserini_ray

    names = [n for n in piserini_ray.__all__ if n != "__version__"]
    values = {n: getattr(piserini_ray, n) for n in names}
    functions = [n for n in names if inspect.isfunction(values[n])]
    classes = [n for n in names if n not in functions]
    out = ["## Contents", "", "| name | what it is |", "|---|---|"]
    for name in functions + classes:
        summary = (inspect.getdoc(values[name]) or "").split("\n\n", 1)[0]
        out.append(f"| [{_code(name)}](#{_api_anchor(name, values[name])}) | {_cell(summary)} |")
    out += ["", "`piserini_ray.__version__` is the installed package's version.", ""]
    out += ["## Functions", ""]
    for name in functions:
        out += _entry(name, values[name])
    out += ["## Types", ""]
    for name in classes:
        out += _entry(name, values[name])
    return "\n".join(out)


def _api_anchor(name: str, value: Any) -> str:
    """A name's id on the API page: types apart from functions (`report` and `Report`)."""
    return _anchor("api" if inspect.isfunction(value) else "api-type", name)


def _signature(name: str, value: Any) -> str:
    """The call as written in the source (annotations as their text, quotes dropped)."""
    if not inspect.isfunction(value):
        bases = ", ".join(b.__name__ for b in value.__bases__ if b is not object)
        return f"class {name}({bases})" if bases else f"class {name}"
    parts, star = [], False
    for p in inspect.signature(value).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = p.name
        if p.annotation is not p.empty:
            text += f": {str(p.annotation).strip(chr(39))}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    returns = inspect.signature(value).return_annotation
    tail = f" -> {str(returns).strip(chr(39))}" if returns is not inspect.Signature.empty else ""
    call = f"{name}({', '.join(parts)}){tail}"
    if len(call) > 88:
        call = f"{name}(\n" + "".join(f"    {p},\n" for p in parts) + f"){tail}"
    return call


def _entry(name: str, value: Any) -> list[str]:
    module = getattr(value, "__module__", "piserini_ray")
    out = [f"### {_code(name)} {{#{_api_anchor(name, value)}}}", ""]
    out += ["```python", _signature(name, value), "```", ""]
    out += [f"Defined in `{module}`; import it as `from piserini_ray import {name}`.", ""]
    text, sections = _sections(inspect.getdoc(value) or "")
    if text:
        out += [_text(text), ""]
    for title in SECTIONS:
        body = sections.get(title)
        if body is None:
            continue
        out += [f"**{title}**", ""]
        if title in ("Args", "Raises"):
            head = "argument" if title == "Args" else "error"
            out += [f"| {head} | description |", "|---|---|"]
            out += [f"| {_code(k)} | {_cell(v)} |" for k, v in _items(body)]
            out.append("")
        elif title == "Example":
            out += [textwrap.dedent(body).strip(), ""]
        else:
            out += [_text(" ".join(textwrap.dedent(body).split())), ""]
    if isinstance(value, type) and issubclass(value, BaseModel):
        out += [_fields_note(value), ""]
    return out


def _fields_note(model: type[BaseModel]) -> str:
    for file, module, name, _ in RECORD_FILES:
        if model.__name__ == name and model.__module__.startswith(module):
            return (
                f"Its fields (a line of `{file}`): "
                f"[record files' reference](records.md#{_anchor('records', name)})."
            )
    if model.__name__ == "RunConfig":
        return "Its fields: the [configuration reference](configuration.md)."
    anchor = _anchor("records", model.__name__)
    return f"Its fields: the [record files' reference](records.md#{anchor})."


def _sections(doc: str) -> tuple[str, dict[str, str]]:
    """A Google-style docstring's text before its sections, and each section's body."""
    text: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] = text
    for line in doc.splitlines():
        header = line.rstrip()[:-1] if line.rstrip().endswith(":") else ""
        if header in SECTIONS and not line.startswith(" "):
            current = sections.setdefault(header, [])
            continue
        current.append(line)
    return "\n".join(text).strip(), {k: "\n".join(v) for k, v in sections.items()}


def _items(body: str) -> Iterator[tuple[str, str]]:
    """`name: text` entries, a continuation indented deeper than its entry."""
    lines = textwrap.dedent(body).splitlines()
    key, words = "", []
    for line in lines:
        if line and not line.startswith(" ") and ":" in line:
            if key:
                yield key, " ".join(words)
            key, _, rest = line.partition(":")
            words = [rest.strip()]
        elif line.strip():
            words.append(line.strip())
    if key:
        yield key, " ".join(words)


# --- the record files' reference --------------------------------------------------------------


def records_reference() -> str:
    from importlib import import_module

    roots = [
        (file, getattr(import_module(module), name), what)
        for file, module, name, what in RECORD_FILES
    ]
    out = ["## Files", "", "| file | model | what it holds |", "|---|---|---|"]
    for file, model, what in roots:
        link = f"[{_code(model.__name__)}](#{_anchor('records', model.__name__)})"
        out.append(f"| {_code(file)} | {link} | {_cell(what)} |")
    out.append("")
    done: set[type[BaseModel]] = set()
    for file, model, _ in roots:
        out += [f"## {_code(file)} {{#{_anchor('file', file)}}}", ""]
        for nested in _walk(model, done):
            out += _model_section(nested)
    return "\n".join(out)


def _walk(model: type[BaseModel], done: set[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    """The model, then every model nested in it not documented yet, depth first."""
    if model in done:
        return
    done.add(model)
    yield model
    for field in model.model_fields.values():
        for nested in _models_in(field.annotation):
            yield from _walk(nested, done)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def field_id(model: type[BaseModel], field: str) -> str:
    """The id of a field's row on the records page (tests/test_docs.py looks for it)."""
    return _anchor("records", f"{model.__name__}-{field}")


def _model_section(model: type[BaseModel]) -> list[str]:
    name = model.__name__
    out = [f"### {_code(name)} {{#{_anchor('records', name)}}}", ""]
    doc, _ = _sections(inspect.getdoc(model) if model.__doc__ else "")
    if doc and model.__doc__ is not BaseModel.__doc__:
        out += [_text(doc.split("\n\n", 1)[0]), ""]
    comments = _field_comments(model)
    out += ["| field | type | default | description |", "|---|---|---|---|"]
    for key, field in model.model_fields.items():
        description = field.description or comments.get(key, "")
        constraints = _constraints(field)
        kind = _type(field.annotation) + (f" ({constraints})" if constraints else "")
        cell = f'<span id="{field_id(model, key)}"></span>{_code(key)}'
        out.append(f"| {cell} | {kind} | {_default(field)} | {_cell(description)} |")
    return [*out, ""]


def _type(tp: Any) -> str:
    """A type in words; a nested model links to its section."""
    if tp is type(None):
        return "`null`"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{_code(tp.__name__)}](#{_anchor('records', tp.__name__)})"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return _one_of([_code(repr(a).replace("'", '"')) for a in args])
    if origin in (typing.Union, types.UnionType):
        return _one_of([_type(a) for a in args])
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type(args[0])}" if args else "`list`"
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}" if args else "mapping"
    if tp is Any:
        return "any"
    return _code(getattr(tp, "__name__", str(tp)))
