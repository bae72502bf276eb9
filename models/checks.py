"""Validation of model config dataclasses: one readable ValueError per broken field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def require(config: Any, checks: Iterable[tuple[str, bool, str]]) -> None:
    """Raise ``ValueError("<Class>.<field> must be <requirement>, got <value>")`` for the first failed check."""
    for name, ok, requirement in checks:
        if not ok:
            raise ValueError(
                f"{type(config).__name__}.{name} must be {requirement}, got {getattr(config, name)!r}"
            )
