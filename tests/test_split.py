from __future__ import annotations

import pandas as pd

from sidrec.config import SplitConfig
from tasks.ingest import ingest
from tasks.split import leave_one_out, sliding_window, split
from tasks.validate import validate
from tests.conftest import csv_settings, write_csv_dataset


def _inter(rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"])


def test_leave_one_out_values():
    df = _inter(
        [("u", i, t) for i, t in [("d", 4), ("a", 1), ("b", 2), ("c", 3), ("e", 5)]]
        + [("v", "x", 1), ("v", "y", 2), ("v", "z", 3)]
    )
    parts = leave_one_out(df, SplitConfig(max_history=2))
    test = parts["test"].set_index("user_id")
    assert test.loc["u", "target"] == "e" and test.loc["u", "history"] == ["c", "d"]
    valid = parts["valid"].set_index("user_id")
    assert valid.loc["u", "target"] == "d" and valid.loc["u", "history"] == ["b", "c"]
    train = parts["train"]
    assert train[train.user_id == "u"]["target"].tolist() == ["b", "c"]
    assert [list(h) for h in train[train.user_id == "u"]["history"]] == [["a"], ["a", "b"]]
    assert (
        train[train.user_id == "v"]["target"].tolist() == []
    )  # 3 items: one each for train-history, valid, test
    assert parts["test"].set_index("user_id").loc["v", "history"] == ["x", "y"]


def test_timestamp_ties_are_broken_by_item_id_whatever_the_row_order():
    rows = [("u", "b", 5), ("u", "a", 5), ("u", "c", 1), ("u", "d", 9)]
    one = leave_one_out(_inter(rows), SplitConfig())
    two = leave_one_out(_inter(rows[::-1]), SplitConfig())
    for name in ("train", "valid", "test"):
        pd.testing.assert_frame_equal(one[name], two[name])
    assert one["valid"]["history"][0] == ["c", "a"]  # a before b at the same time


def test_sliding_window_is_chronological_8_1_1():
    rows = [(f"u{u}", f"i{k}", 10 * k + u) for u in range(4) for k in range(6)]
    parts = sliding_window(_inter(rows), SplitConfig(method="sliding_window"))
    sizes = {k: len(v) for k, v in parts.items()}
    assert sizes == {"train": 16, "valid": 2, "test": 2}  # 20 samples
    assert parts["train"]["timestamp"].max() <= parts["valid"]["timestamp"].min()
    assert parts["valid"]["timestamp"].max() <= parts["test"]["timestamp"].min()


def test_split_stage_writes_parquet_with_schema(project):
    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items)
    ingest(settings)
    validate(settings)
    result = split(settings)
    assert {k: result.metrics[k]["rows"] for k in ("train", "valid", "test")} == {
        "train": 3,
        "valid": 3,
        "test": 3,
    }
    test = pd.read_parquet(settings.paths.split("test"))
    assert test.columns.tolist() == ["user_id", "history", "target", "timestamp"]
    assert sorted(test["target"]) == ["d", "d", "d"]
