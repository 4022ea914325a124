"""What an imported run's own files say about it (`imported.json` in its run directory, written
by `piserini-ray import`): the model, retriever and settings they state (or that they state
none), the files read and skipped and why, the docids dropped because the corpus lacks them,
and how its cost was priced. The report prints these instead of the import config's settings,
which are ours, not the run's."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from piserini_ray.store.report_files import write_report_file

FILE = "imported.json"


class SkippedFile(BaseModel):
    file: str
    reason: str


class CostNote(BaseModel):
    """How the run's cost was priced: with which model and table entry, or why not."""

    model: str | None
    priced: bool
    #: Why the cost is n/a (an unknown model, no usage), or how it was bounded.
    note: str = ""
    #: Set when the files cannot tell cache writes from cache reads (BrowseComp-Plus's
    #: Anthropic client sums them): the cost priced both ways; the records hold the lower.
    lower_usd: float | None = None
    upper_usd: float | None = None


class ImportedRun(BaseModel):
    format: str
    source: str
    #: Models the files name (most common first); the run's config takes the first.
    models: list[str] = Field(default_factory=list)
    #: The retriever and its settings in words, as the files state them, or "unknown".
    retriever: str = "unknown"
    #: Every other setting the files state (name -> value) and where each came from.
    settings: dict[str, str] = Field(default_factory=dict)
    settings_source: list[str] = Field(default_factory=list)
    files_read: int = 0
    imported: int = 0
    skipped: list[SkippedFile] = Field(default_factory=list)
    #: One line per thing the import changed or could not tell (empty answers, dropped
    #: docids, re-derived citations, the usage convention).
    notes: list[str] = Field(default_factory=list)
    cost: CostNote | None = None


def write_imported(run_dir: Path, run: ImportedRun) -> Path:
    return write_report_file(Path(run_dir) / FILE, run.model_dump_json(indent=2) + "\n")


def read_imported(run_dir: Path) -> ImportedRun | None:
    """The run's `imported.json`; None for a run of our own."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    return ImportedRun.model_validate_json(path.read_bytes())


def settings_text(run: ImportedRun) -> str:
    """The run's model, retriever and settings in words, from its own files."""
    model = ", ".join(run.models) or "unknown (the files name none)"
    stated = "; ".join(f"{k} {v}" for k, v in run.settings.items()) or "none stated"
    where = ", ".join(run.settings_source) or "the run files"
    return f"model {model}, retriever {run.retriever}; settings ({where}): {stated}"


def imported_lines(run: ImportedRun) -> list[str]:
    """The report's lines for an imported run: its own settings, what was skipped and why,
    what the import changed, how the cost was priced."""
    lines = [
        f"As its files state it (not the import config's settings): {settings_text(run)}.",
        f"Files: {run.files_read} read, {run.imported} imported, {len(run.skipped)} skipped"
        + (": " + "; ".join(f"{s.file} ({s.reason})" for s in run.skipped) if run.skipped else "")
        + ".",
    ]
    lines += [f"Import: {note}" for note in run.notes]
    if run.cost is not None and run.cost.note:
        lines.append(f"Cost: {run.cost.note}")
    return lines
