"""Number formatting shared by the markdown parts of the reports."""

from __future__ import annotations


def percent(value: float | None, digits: int = 1) -> str:
    """A share as a percentage, or "n/a" where it is undefined."""
    return "n/a" if value is None else f"{100 * value:.{digits}f}"
