"""What a run's own files state about its model, retriever and settings; "unknown" for what
they do not state (never the import config's values, which are ours)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from piserini_ray.formats.peer_files import Format, Run, read_json


@dataclass
class Stated:
    models: list[str] = field(default_factory=list)
    retriever: str = "unknown"
    settings: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    #: Pi-Serini's run setup: BM25 k1, b and the per-query timeout, as numbers, when stated.
    bm25: tuple[float, float] | None = None
    timeout_seconds: float | None = None


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items() if v is not None)
    return str(value)


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _common(values: list[Any]) -> list[str]:
    """Distinct stated values, the most common first."""
    return [v for v, _ in Counter(str(v) for v in values if v not in (None, "")).most_common()]


def stated(fmt: Format, folder: Path, runs: list[Run]) -> Stated:
    out = Stated(models=_common([r.metadata.model for r in runs]))
    extras = [r.metadata.model_extra or {} for r in runs]
    if fmt == "browsecomp-plus":
        out.sources.append("metadata of the run files")
        for key in ("reasoning", "thinking", "max_tokens", "max_output_tokens"):
            values = _common([_text(e[key]) for e in extras if e.get(key) is not None])
            if values:
                out.settings[key] = " | ".join(values)
        out.retriever = "unknown (BrowseComp-Plus run files do not state it)"
        ours = [e for e in extras if e.get("framework") == "piserini_ray"]
        if ours:
            out.retriever = "unknown (our export does not carry it; see the original run)"
        return out
    for key in ("prompt_variant", "benchmark_id", "query_set_id"):
        values = _common([e.get(key) for e in extras])
        if values:
            out.settings[key] = " | ".join(values)
    out.sources.append("metadata of the run files")
    # A sharded run keeps its setup beside merged/, or in it (their merge copies every .json).
    for name in ("run_setup.json", "benchmark_manifest_snapshot.json"):
        for where in (folder, folder.parent):
            data = read_json(where / name)
            if data:
                out.sources.append(str(where / name))
                break
        else:
            continue
        if name == "run_setup.json":
            keys = ("model", "slice", "timeoutSeconds", "bm25K1", "bm25B", "indexPath",
                    "shardCount")  # fmt: skip
            out.settings |= {k: str(data[k]) for k in keys if data.get(k) not in (None, "")}
            if not out.models and data.get("model"):
                out.models = [str(data["model"])]
            k1, b = _number(data.get("bm25K1")), _number(data.get("bm25B"))
            if k1 is not None and b is not None:
                out.bm25 = (k1, b)
            out.timeout_seconds = _number(data.get("timeoutSeconds"))
        else:
            stated = ("benchmark_id", "prompt_variant", "index_path", "git_commit_short")
            out.settings |= {k: str(data[k]) for k in stated if data.get(k) not in (None, "")}
    out.retriever = (
        f"BM25 k1={out.bm25[0]:g} b={out.bm25[1]:g} (Pi-Serini's search tool; depth not stated)"
        if out.bm25
        else "BM25 (Pi-Serini's search tool; k1, b and depth not stated)"
    )
    return out
