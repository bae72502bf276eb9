from __future__ import annotations

from collections import defaultdict
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sidrec.config import SplitConfig
from sidrec.errors import InputError
from sidrec.io import read_table
from sidrec.schemas import HISTORY, SPLIT
from tasks.ingest import ingest
from tasks.split import leave_one_out, sliding_window, split
from tasks.validate import validate


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


def test_timestamp_ties_keep_the_source_row_order():
    rows = [("u", "b", 5), ("u", "a", 5), ("u", "c", 1), ("u", "d", 9)]
    one = leave_one_out(_inter(rows), SplitConfig())
    assert one["valid"]["target"].tolist() == ["a"] and one["valid"]["history"][0] == ["c", "b"]
    assert one["test"]["history"][0] == ["c", "b", "a"]
    two = leave_one_out(_inter(rows[::-1]), SplitConfig())  # a now comes before b in the file
    assert two["valid"]["target"].tolist() == ["b"] and two["valid"]["history"][0] == ["c", "a"]


def test_shuffled_rows_with_distinct_timestamps_give_the_same_split():
    rows = [(f"u{u}", f"i{(7 * k + u) % 13}", 100 * k + u) for u in range(5) for k in range(6)]
    df = _inter(rows)
    one = leave_one_out(df, SplitConfig(max_history=3))
    two = leave_one_out(df.sample(frac=1.0, random_state=0), SplitConfig(max_history=3))
    for name in ("train", "valid", "test"):
        pd.testing.assert_frame_equal(one[name], two[name])


def test_sliding_window_is_chronological_8_1_1():
    rows = [(f"u{u}", f"i{k}", 10 * k + u) for u in range(4) for k in range(6)]
    parts = sliding_window(_inter(rows), SplitConfig(method="sliding_window"))
    sizes = {k: len(v) for k, v in parts.items()}
    assert sizes == {"train": 16, "valid": 2, "test": 2}  # 20 samples
    assert parts["train"]["timestamp"].max() <= parts["valid"]["timestamp"].min()
    assert parts["valid"]["timestamp"].max() <= parts["test"]["timestamp"].min()


def test_sliding_window_ties_across_users_keep_the_source_row_order():
    rows = [("v", "x", 1), ("u", "a", 1), ("v", "y", 2), ("u", "b", 2)]
    cfg = SplitConfig(method="sliding_window")  # 2 samples: both in train
    assert sliding_window(_inter(rows), cfg)["train"]["target"].tolist() == ["y", "b"]
    swapped = rows[1::-1] + rows[:1:-1]  # u's rows first at each time
    assert sliding_window(_inter(swapped), cfg)["train"]["target"].tolist() == ["b", "y"]


def test_split_stage_writes_parquet_with_schema(project, write_csv_dataset, csv_settings):
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
    # histories on disk as item-id codes into one dictionary (sidrec.schemas.HISTORY), read
    # back by every reader as a sequence of item-id strings per row
    assert pq.read_schema(settings.paths.split("test")).field("history").type.equals(HISTORY)
    read = read_table(settings.paths.split("test"), SPLIT, "test split")
    assert [h.tolist() for h in read["history"]] == [h.tolist() for h in test["history"]]
    assert all(type(i) is str for h in read["history"] for i in h) and len(read["history"][0])


def test_a_split_that_leaves_a_part_empty_is_refused_and_writes_nothing(
    project, write_csv_dataset, csv_settings
):
    inter, items = write_csv_dataset(project / "src")
    split_cfg = {"method": "sliding_window", "ratios": [0.9, 0.05, 0.05]}  # of 9 samples
    settings = csv_settings(project, inter, items, split=split_cfg)
    ingest(settings)
    validate(settings)
    with pytest.raises(InputError) as refused:
        split(settings)
    message = str(refused.value)
    assert "split's test part is empty (train 8, valid 1, test 0)" in message
    assert "split.ratios [0.9, 0.05, 0.05]" in message
    assert not any(settings.paths.split(name).exists() for name in ("train", "valid", "test"))
    assert not settings.paths.metrics("split").exists()


def test_csv_ties_follow_the_file_through_ingest_and_validate(
    project, write_csv_dataset, csv_settings
):
    # u1 rates d then c in the same second (against id order); u9 is dropped by validate
    t = 1_600_000_000
    rows = [("u1", "a", t), ("u9", "a", t + 1), ("u1", "b", t + 2), ("u1", "d", t + 3)]
    rows.append(("u1", "c", t + 3))
    lines = ["user_id,item_id,timestamp", *(",".join(map(str, r)) for r in rows)]
    inter, items = write_csv_dataset(project / "src", interactions="\n".join(lines) + "\n")
    settings = csv_settings(project, inter, items)
    ingest(settings)
    validate(settings)
    split(settings)
    test = pd.read_parquet(settings.paths.split("test"))
    assert test["user_id"].tolist() == ["u1"]
    assert test["target"].tolist() == ["c"] and test["history"][0].tolist() == ["a", "b", "d"]


RECBOLE_HEADER = ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]


def recbole_sequences(raw: pd.DataFrame) -> dict[str, list[str]]:
    """Each user's items as RecBole orders them for leave-one-out: a stable sort of the file
    by timestamp (``Interaction.sort``), then per user in that order (``_grouped_index``) —
    the same as a stable sort by (user, timestamp)."""
    order = np.argsort(raw["timestamp"].to_numpy(), kind="stable")
    sequences: dict[str, list[str]] = defaultdict(list)
    for user, item in zip(
        raw["user_id"].to_numpy()[order], raw["item_id"].to_numpy()[order], strict=True
    ):
        sequences[user].append(item)
    return sequences


def test_movielens_100k_leave_one_out_equals_recboles(project, make_settings):
    """Valid and test targets are RecBole's, so our numbers compare with published ones."""
    folder = metadata.distribution("recbole").locate_file("recbole/dataset_example/ml-100k")
    raw = pd.read_csv(Path(str(folder)) / "ml-100k.inter", sep="\t", dtype=str)
    assert raw.columns.tolist() == RECBOLE_HEADER
    raw.columns = ["user_id", "item_id", "rating", "timestamp"]
    raw["timestamp"] = raw["timestamp"].astype(float)
    expected = recbole_sequences(raw)
    last = raw["timestamp"] == raw.groupby("user_id")["timestamp"].transform("max")
    tied = raw[last].groupby("user_id").size().gt(1).sum()
    assert len(expected) == 943 and tied == 415  # ties at the end: the tie rule matters

    settings = make_settings(project, ingest={"source": "movielens-100k", "min_rating": None})
    ingest(settings)
    validate(settings)
    split(settings)
    h = settings.split.max_history
    for name, back in (("valid", 2), ("test", 1)):
        got = pd.read_parquet(settings.paths.split(name)).set_index("user_id")
        assert len(got) == 943
        assert got["target"].to_dict() == {u: s[-back] for u, s in expected.items()}
        histories = {u: list(hist) for u, hist in got["history"].items()}
        assert histories == {u: s[max(0, len(s) - back - h) : -back] for u, s in expected.items()}
