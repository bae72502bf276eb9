"""Fixtures of the model tests: random SID maps (``sid_maps``) and leave-one-out split rows
(``split_rows``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import pandas as pd

# ---------------------------------------------------------------- random SID maps


@pytest.fixture(scope="session")
def sid_maps() -> Callable[[int, int], Any]:
    """``sid_maps(max_levels, max_codes)``: a hypothesis strategy of SID maps (distinct tuples
    of one length, 1 to ``max_levels`` codes of 0 to ``max_codes`` - 1, at most 60 of them)."""
    from hypothesis import strategies as st

    def strategy(max_levels: int, max_codes: int) -> st.SearchStrategy[list[tuple[int, ...]]]:
        return st.integers(1, max_levels).flatmap(
            lambda levels: st.integers(1, max_codes).flatmap(
                lambda k: st.lists(
                    st.tuples(*[st.integers(0, k - 1)] * levels),
                    min_size=1,
                    max_size=min(60, k**levels),
                    unique=True,
                )
            )
        )

    return strategy


# ---------------------------------------------------------------- leave-one-out split rows


def _split_rows(sequences: dict[str, list[str]], max_history: int) -> dict[str, pd.DataFrame]:
    """Leave-one-out rows as tasks/split.py writes them: last → test, second-to-last → valid."""
    import pandas as pd

    parts: dict[str, list[dict[str, object]]] = {"train": [], "valid": [], "test": []}
    for user, seq in sequences.items():
        for pos in range(1, len(seq)):
            part = {len(seq) - 1: "test", len(seq) - 2: "valid"}.get(pos, "train")
            history = seq[max(0, pos - max_history) : pos]
            parts[part].append(
                {"user_id": user, "history": history, "target": seq[pos], "timestamp": pos}
            )
    return {name: pd.DataFrame(rows) for name, rows in parts.items()}


@pytest.fixture(scope="session")
def split_rows() -> Callable[[dict[str, list[str]], int], dict[str, pd.DataFrame]]:
    """``split_rows(sequences, max_history)``: the train / valid / test rows of each user's
    item sequence, as tasks/split.py writes them (last item → test, second-to-last → valid,
    histories capped at ``max_history``)."""
    return _split_rows
