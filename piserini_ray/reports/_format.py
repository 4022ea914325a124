"""Formatting shared by the reports: numbers for the markdown parts, figures as PNG bytes."""

from __future__ import annotations

import io
from typing import Any


def percent(value: float | None, digits: int = 1) -> str:
    """A share as a percentage, or "n/a" where it is undefined."""
    return "n/a" if value is None else f"{100 * value:.{digits}f}"


def png(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (written by `store/report_files.py`, like every report
    file)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()
