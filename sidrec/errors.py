"""Errors a user can act on.

Everything raised for bad input or bad configuration is a :class:`SidrecError`: the CLI
prints its message (no traceback unless ``--debug``) and exits non-zero, and Prefect does
not retry it (retrying cannot fix the input).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


class SidrecError(Exception):
    """Base class for errors caused by the user's input or configuration."""


class ConfigError(SidrecError):
    """``params.yaml`` or a ``--set`` override is invalid."""


class InputError(SidrecError):
    """An input file cannot be read or does not have the expected content."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        column: str | None = None,
        rows: Sequence[int] = (),
        values: Sequence[Any] = (),
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.column = column
        self.rows = list(rows)
        self.values = list(values)
        parts = []
        if self.path is not None:
            parts.append(f"{self.path}")
        if column is not None:
            parts.append(f"column '{column}'")
        where = ", ".join(parts)
        text = f"{where}: {message}" if where else message
        if self.rows:
            text += f" (rows {_preview(self.rows)})"
        if self.values:
            text += f"; sample values: {_preview([repr(v) for v in self.values])}"
        super().__init__(text)


class ValidationFailed(SidrecError):
    """Great Expectations (or a dataset-level check) rejected the data; carries the summary."""

    def __init__(self, summary: str, report: dict[str, Any]) -> None:
        self.report = report
        super().__init__(summary)


def _preview(items: Sequence[Any], limit: int = 5) -> str:
    shown = ", ".join(str(x) for x in items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")
