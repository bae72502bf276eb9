"""Fixtures of the tests of tasks/: what ``sft`` returned for the session's trained model
(``sft_result``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sidrec.stage import StageResult


@pytest.fixture(scope="session")
def sft_result(_trained_template: tuple[Path, StageResult]) -> StageResult:
    """What ``sft`` returned when it trained the model that ``trained`` copies."""
    return _trained_template[1]
