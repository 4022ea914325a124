"""The `benchmark` and `slice` sections: which benchmark a run loads, from where, and which of
its queries it takes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from piserini_ray.config.base import StrictModel


class BenchmarkConfig(StrictModel):
    """Which benchmark to load and from where (docs/spec.md §1)."""

    IDENTITY = (
        "source",
        "name",
        "queries",
        "corpus",
        "qrels_evidence",
        "qrels_gold",
        "obfuscated",
        "canary",
    )
    NOT_IDENTITY = ()

    source: Literal["sample", "jsonl", "browsecomp-plus"] = "sample"
    name: str | None = None
    queries: Path | None = None
    corpus: Path | None = None
    qrels_evidence: Path | None = None
    qrels_gold: Path | None = None
    #: BrowseComp-Plus only: whether the query file is still obfuscated, and its canary string.
    obfuscated: bool = True
    canary: str | None = None

    @model_validator(mode="after")
    def _name_is_a_folder_name(self) -> BenchmarkConfig:
        # It names run directories (`<runs root>/<benchmark>-<model>-<hash>`) and tuning folders.
        if self.name is not None and not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", self.name
        ):
            raise ValueError(
                f"benchmark.name {self.name!r} must be a plain name of at most 100 letters, "
                "digits, '.', '_' or '-' (starting with a letter or digit): it names run "
                "directories, e.g. browsecomp-plus"
            )
        return self

    @model_validator(mode="after")
    def _check_paths(self) -> BenchmarkConfig:
        given = [
            f for f in ("queries", "corpus", "qrels_evidence", "qrels_gold") if getattr(self, f)
        ]
        if self.source == "sample" and given:
            raise ValueError(
                f"benchmark.{given[0]} is set but benchmark.source is 'sample' (the default), "
                "which would ignore it and run the embedded sample; set benchmark.source: jsonl "
                "(or browsecomp-plus) to use your files"
            )
        if self.source == "jsonl":
            missing = [f for f in ("queries", "corpus") if getattr(self, f) is None]
            if missing:
                raise ValueError(
                    f"benchmark.source 'jsonl' needs benchmark.{' and benchmark.'.join(missing)} "
                    "(paths to your JSONL files; see README 'Your own data')"
                )
        if self.source == "browsecomp-plus":
            if self.queries is None or self.corpus is None:
                raise ValueError(
                    "benchmark.source 'browsecomp-plus' needs benchmark.queries (the query "
                    "parquet/JSONL you downloaded) and benchmark.corpus (the corpus parquet/JSONL)"
                )
            if self.obfuscated and not self.canary:
                raise ValueError(
                    "benchmark.canary is required: the BrowseComp-Plus queries are obfuscated "
                    "and are decrypted with the dataset's canary string (see its dataset card); "
                    "set benchmark.obfuscated: false if your file is already decrypted"
                )
        return self

    def display_name(self) -> str:
        return self.name or self.source


class SliceConfig(StrictModel):
    """Which queries of the benchmark a run takes: all, an id list, an id file or a sample."""

    IDENTITY = ("ids", "ids_file", "sample", "seed")
    NOT_IDENTITY = ()

    ids: list[str] | None = None
    ids_file: Path | None = None
    sample: int | None = Field(None, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _one_kind(self) -> SliceConfig:
        kinds = [k for k in ("ids", "ids_file", "sample") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"slice takes one of ids, ids_file, sample; got {', '.join(kinds)}")
        return self
