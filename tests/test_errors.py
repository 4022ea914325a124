"""Every error of ours survives pickling (Ray ships an actor's or a task's error to the driver
that way; one that cannot be rebuilt arrives as Ray's `UnserializableException`)."""

from __future__ import annotations

import pickle

import pytest

from piserini_ray.engines.ray.readiness import StartupError
from piserini_ray.errors import (
    ConfigError,
    DataError,
    IndexBuildError,
    InfrastructureError,
    PiseriniRayError,
    ProviderRefused,
    RequestTooLarge,
)
from piserini_ray.llm.failures import Failure, FailureKind, RetryError
from piserini_ray.retrieval.encoder import EncoderError


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("retrieval.depth: must be positive"),
        DataError("corpus.jsonl", "docid 'd2' appears twice", line=4),
        DataError("qrels.txt", "no query matches"),
        IndexBuildError("no documents"),
        InfrastructureError("the limiter is gone"),
        ProviderRefused("bad key"),
        RequestTooLarge("larger than the quota"),
        RetryError(Failure(FailureKind.TRANSIENT, "503"), 8, ["503", "503"], 1.5, 2.0),
        EncoderError("no such model"),
        StartupError("no GPU"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_every_error_pickles_to_itself(error: PiseriniRayError) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert vars(again) == vars(error)
