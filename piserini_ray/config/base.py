"""The base of every config model: frozen, unknown keys rejected, and each field's part in a
run's identity declared.

A run's identity (its config hash, which names its directory and guards its resume) is an
allow-list: a field counts only if its model lists it in `IDENTITY`. Every field is listed in
exactly one of `IDENTITY` and `NOT_IDENTITY`, checked when the class is defined, so a new field
cannot join or leave a run's identity without that decision being written down (and
`tests/config/test_config.py` pins the whole list).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Fields that shape what a run computes (its results), and so name it.
    IDENTITY: ClassVar[tuple[str, ...]] = ()
    #: Fields that do not: where and how wide it runs, what it costs, how it is judged.
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ()
    #: Identity fields added after runs were named: left out of the identity while at their
    #: default, so that every earlier run keeps its name (and resumes).
    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()
    #: Identity fields since removed, with the one value every run had for them: still counted,
    #: as constants, so that every existing run keeps its name (and resumes).
    RETIRED_IDENTITY: ClassVar[dict[str, Any]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        fields = set(cls.model_fields)
        identity, other = set(cls.IDENTITY), set(cls.NOT_IDENTITY)
        undecided, unknown, both = (
            fields - identity - other,
            (identity | other) - fields,
            identity & other,
        )
        if not set(cls.OMITTED_AT_DEFAULT) <= identity:
            raise TypeError(f"{cls.__name__}: OMITTED_AT_DEFAULT lists fields not in IDENTITY")
        if set(cls.RETIRED_IDENTITY) & fields:
            raise TypeError(f"{cls.__name__}: RETIRED_IDENTITY names fields it still has")
        if undecided or unknown or both:
            raise TypeError(
                f"{cls.__name__}: list every field once in IDENTITY or NOT_IDENTITY (does it "
                f"change what a run computes?); undecided: {sorted(undecided)}, not fields: "
                f"{sorted(unknown)}, in both: {sorted(both)}"
            )


def identity_data(model: StrictModel) -> dict[str, Any]:
    """The model's identity fields as JSON-ready data, nested models by their own lists (a
    field of `OMITTED_AT_DEFAULT` only where its identity differs from its default's; the
    constants of `RETIRED_IDENTITY` as they were)."""
    cls = type(model)
    data: dict[str, Any] = copy.deepcopy(cls.RETIRED_IDENTITY)
    for name in cls.IDENTITY:
        data[name] = _field_identity(model, name, getattr(model, name))
        if name in cls.OMITTED_AT_DEFAULT:
            default = cls.model_fields[name].get_default(call_default_factory=True)
            if data[name] == _field_identity(model, name, default):
                del data[name]
    return data


def _field_identity(model: StrictModel, name: str, value: Any) -> Any:
    if isinstance(value, StrictModel):
        return identity_data(value)
    return model.model_copy(update={name: value}).model_dump(mode="json", include={name})[name]


def default_home() -> Path:
    """Where indexes and caches go unless configured: `$PISERINI_RAY_HOME` or ~/.cache."""
    env = os.environ.get("PISERINI_RAY_HOME")
    return Path(env) if env else Path.home() / ".cache" / "piserini_ray"
