"""The base of every settings section: strict (unknown keys are errors) and frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    # attribute docstrings become the fields' descriptions: docs/settings.md renders them
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
