"""Evaluate's pieces that need no trained model: which items a row may not be shown, the
invalid rate of a SID model's rankings, and the words of the run summary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.evaluate import _score, exclusions, verdict


def _rows(user: str, history: list[str], target: str, stamp: int) -> dict:
    return {"user_id": user, "history": history, "target": target, "timestamp": stamp}


SPLITS = {
    "train": pd.DataFrame([_rows("u", ["a"], "b", 1), _rows("v", ["x"], "y", 1)]),
    "valid": pd.DataFrame([_rows("u", ["a", "b"], "c", 2), _rows("v", ["x", "y"], "z", 2)]),
    "test": pd.DataFrame([_rows("u", ["b", "c"], "d", 3)]),
}


def test_test_rows_exclude_the_train_and_valid_items_and_valid_rows_the_train_items(
    make_settings, project
):
    settings = make_settings(project)
    assert settings.evaluate.exclude_seen
    # u's valid target c is seen before its test target: never recommended for the test row
    assert exclusions(settings, SPLITS, "test", SPLITS["test"]) == [["a", "b", "c"]]
    valid_rows = SPLITS["valid"]
    assert exclusions(settings, SPLITS, "valid", valid_rows) == [["a", "b"], ["x", "y"]]
    repeats = make_settings(project, evaluate={"exclude_seen": False})
    assert exclusions(repeats, SPLITS, "test", SPLITS["test"]) is None


def test_invalid_rate_counts_the_misses_exclusion_does_not_explain():
    # 2 rows, k = 3; row 0 could rank 3 items but got one -1 (an invalid SID); row 1 had only
    # 2 items left after exclusion, so its one -1 is expected
    topk = np.array([[0, 1, -1], [2, 3, -1]])
    rows, frames = _score(
        {"sft": topk, "sasrec": topk},
        targets=np.array([1, 0]),
        ks=[1, 3],
        counts=np.array([5, 4, 3, 2]),
        allowed=np.array([4, 2]),
    )
    assert rows["sft"]["invalid_rate"] == round(1 / 6, 6)  # reported to 6 places
    assert "invalid_rate" not in rows["sasrec"]  # a baseline ranks items, not SIDs
    assert frames["sft"]["hr@3"].tolist() == [1.0, 0.0] and rows["sft"]["hr@1"] == 0.0
    assert rows["sft"]["ndcg@3"] == round(0.5 / np.log2(3), 6)


@pytest.mark.parametrize(
    ("low", "high", "words"),
    [(0.001, 0.01, "beats"), (-0.01, -0.001, "trails"), (-0.01, 0.01, "is within noise of")],
)
def test_beats_only_where_the_interval_excludes_zero(low, high, words):
    assert verdict({"mean": (low + high) / 2, "low": low, "high": high}) == words
    assert verdict({"mean": 0.0, "low": 0.0, "high": 0.01}) == "is within noise of"
