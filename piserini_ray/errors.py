"""Errors a user can act on: each names the input and how to fix it."""

from pydantic import ValidationError


class PiseriniRayError(Exception):
    """Base class for every error the framework raises on purpose: its message names the
    input at fault and the fix; the command line prints it and exits 2.

    Args:
        message: what is wrong and how to fix it.

    Returns:
        The error, to raise.

    Example:
        ```python
        from piserini_ray import PiseriniRayError, load_config

        try:
            load_config("missing.yaml")
        except PiseriniRayError as error:
            print(error)
        ```
    """


class ConfigError(PiseriniRayError):
    """A configuration value is missing or invalid.

    Args:
        message: the key or file at fault, and the fix.

    Returns:
        The error, to raise.

    Example:
        ```python
        from piserini_ray import ConfigError, load_config

        try:
            load_config(overrides={"slice.smaple": 3})
        except ConfigError as error:
            print(error)  # names the unknown key
        ```
    """


class DataError(PiseriniRayError):
    """An input file is malformed. The message names the file, the line and the problem.

    Args:
        path: the file.
        problem: what is wrong, and the fix.
        line: the line number, when the problem has one.

    Returns:
        The error, to raise.

    Example:
        ```python
        from piserini_ray import DataError

        error = DataError("corpus.jsonl", "not JSON", line=3)
        assert str(error) == "corpus.jsonl:3: not JSON"
        ```
    """

    def __init__(self, path: object, problem: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[object, str, int | None]]:
        # Pickled whole (a Ray actor's error reaches the driver so): the default would call
        # DataError(message) and fail.
        return (type(self), (self.path, self.problem, self.line))


class IndexBuildError(PiseriniRayError):
    """A Lucene index could not be built or opened."""


def describe_validation_error(error: ValidationError) -> str:
    """pydantic's errors as one line: `field.path: problem; ...`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(record)'}: {err['msg']}"
        for err in error.errors()
    )


class RequestTooLarge(PiseriniRayError):
    """A call whose token reservation exceeds the whole per-minute token quota: it could never
    be admitted, so it is refused before it is sent (a permanent failure)."""


class InfrastructureError(PiseriniRayError):
    """Something under the query failed (its rate limiter is gone, ...), not the query: the
    scheduler runs the query again instead of recording a failure."""


class ProviderRefused(PiseriniRayError):
    """The provider refuses every call of this run (a bad key, an unknown model, an exhausted
    quota), not this query: no record is written, the run starts no more queries, and a
    resume after the fix runs them."""
