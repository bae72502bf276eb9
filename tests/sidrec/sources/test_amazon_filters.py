"""The Amazon reviews reader: k-core, minimum rating, time window, duplicates and the counts
of what each drops."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from sidrec.config import AmazonConfig, IngestConfig
from sidrec.sources import read_source
from sidrec.sources.amazon import k_core, read_amazon

T0 = 1_500_000_000  # 2017-07-14T02:40:00Z


# ---------------------------------------------------------------------------- k-core


@pytest.fixture
def cascade_reviews(amazon) -> list[dict[str, Any]]:
    """With k=2, removing item D (1 review) leaves u4 with 1 review, removing u4 leaves item C
    with 1 review, removing C leaves u3 with 1 review; only u1/u2 x A/B survive."""
    pairs = [
        ("u1", "A"),
        ("u1", "B"),
        ("u2", "A"),
        ("u2", "B"),
        ("u3", "B"),
        ("u3", "C"),
        ("u4", "C"),
        ("u4", "D"),
    ]
    return [amazon.review18(u, i, T0 + n) for n, (u, i) in enumerate(pairs)]


@pytest.fixture
def cascade_meta(amazon) -> list[dict[str, Any]]:
    return [amazon.meta18(i, f"Item {i}") for i in "ABCD"]


def test_k_core_is_iterated_until_stable(tmp_path, amazon, cascade_reviews, cascade_meta):
    tables = amazon.read(tmp_path, cascade_reviews, cascade_meta, k_core=2)
    assert amazon.triples(tables) == [
        ("u1", "A", T0),
        ("u1", "B", T0 + 1),
        ("u2", "A", T0 + 2),
        ("u2", "B", T0 + 3),
    ]
    assert tables.items["item_id"].tolist() == ["A", "B"]
    assert tables.notes["reviews_removed_by_k_core"] == 4
    # every survivor has >= k interactions on both sides
    inter = tables.interactions
    assert inter["user_id"].value_counts().min() >= 2
    assert inter["item_id"].value_counts().min() >= 2


def test_k_core_one_keeps_everything_and_three_removes_everything(
    tmp_path, amazon, cascade_reviews, cascade_meta
):
    kept = amazon.read(tmp_path, cascade_reviews, cascade_meta, k_core=1)
    assert len(kept.interactions) == 8
    assert kept.items["item_id"].tolist() == ["A", "B", "C", "D"]
    assert kept.notes["reviews_removed_by_k_core"] == 0
    gone = amazon.read(tmp_path, cascade_reviews, cascade_meta, k_core=3)
    assert gone.interactions.empty and gone.items.empty
    assert gone.notes["reviews_removed_by_k_core"] == 8


def test_k_core_function_on_a_frame(cascade_reviews):
    import pandas as pd

    df = pd.DataFrame(
        [(r["reviewerID"], r["asin"]) for r in cascade_reviews], columns=["user_id", "item_id"]
    )
    core = k_core(df, 2)
    assert sorted(zip(core["user_id"], core["item_id"], strict=True)) == [
        ("u1", "A"),
        ("u1", "B"),
        ("u2", "A"),
        ("u2", "B"),
    ]
    assert core.index.tolist() == [0, 1, 2, 3]


def test_default_k_core_is_5(tmp_path, amazon):
    # 5 users x 5 items is a 5-core; a 6th user with 4 reviews is not
    reviews = [
        amazon.review18(f"U{u}", f"I{i}", T0 + 10 * u + i) for u in range(5) for i in range(5)
    ]
    reviews += [amazon.review18("U5", f"I{i}", T0 + 100 + i) for i in range(4)]
    meta = [amazon.meta18(f"I{i}", f"Item {i}") for i in range(5)]
    rpath = amazon.write_jsonl(tmp_path / "r.json", reviews)
    mpath = amazon.write_jsonl(tmp_path / "m.json", meta)
    tables = read_amazon(AmazonConfig(reviews=rpath, meta=mpath))
    assert sorted(tables.interactions["user_id"].unique()) == ["U0", "U1", "U2", "U3", "U4"]
    assert len(tables.interactions) == 25
    assert tables.notes["reviews_removed_by_k_core"] == 4


def test_min_rating_is_applied_before_k_core(tmp_path, amazon):
    # u1's low rating of B leaves u1 with one review: with k=2 u1 disappears entirely
    reviews = [
        amazon.review18("u1", "A", T0, 5.0),
        amazon.review18("u1", "B", T0 + 1, 2.0),
        amazon.review18("u2", "A", T0 + 2, 5.0),
        amazon.review18("u2", "B", T0 + 3, 4.0),
        amazon.review18("u3", "A", T0 + 4, 4.0),
        amazon.review18("u3", "B", T0 + 5, 5.0),
    ]
    rpath = amazon.write_jsonl(tmp_path / "r.json", reviews)
    mpath = amazon.write_jsonl(
        tmp_path / "m.json", [amazon.meta18("A", "Alpha"), amazon.meta18("B", "Beta")]
    )
    cfg = IngestConfig(
        source="amazon", min_rating=4.0, amazon=AmazonConfig(reviews=rpath, meta=mpath, k_core=2)
    )
    tables = read_source(cfg)
    assert amazon.triples(tables) == [
        ("u2", "A", T0 + 2),
        ("u2", "B", T0 + 3),
        ("u3", "A", T0 + 4),
        ("u3", "B", T0 + 5),
    ]
    assert (tables.interactions["rating"] >= 4.0).all()
    assert tables.notes["reviews_removed_by_k_core"] == 1  # u1's remaining review of A


# ---------------------------------------------------------------------------- window, duplicates


def test_time_window_keeps_start_and_excludes_end(tmp_path, amazon):
    start = 1_577_836_800  # 2020-01-01T00:00:00Z
    end = 1_578_009_600  # 2020-01-03T00:00:00Z
    times = [start - 1, start, start + 86_400, end - 1, end, end + 86_400]
    reviews = [amazon.review18("U1", f"I{k}", t) for k, t in enumerate(times)]
    meta = [amazon.meta18(f"I{k}", f"Item {k}") for k in range(len(times))]
    tables = amazon.read(
        tmp_path, reviews, meta, start=dt.date(2020, 1, 1), end=dt.date(2020, 1, 3)
    )
    assert tables.interactions["timestamp"].tolist() == [start, start + 86_400, end - 1]
    assert tables.items["item_id"].tolist() == ["I1", "I2", "I3"]
    assert tables.notes["reviews_outside_window"] == 3


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ({"start": dt.date(2020, 1, 2)}, [1_577_923_200, 1_578_009_600]),
        ({"end": dt.date(2020, 1, 2)}, [1_577_836_800]),
    ],
)
def test_open_ended_time_window(tmp_path, window, expected, amazon):
    times = [1_577_836_800, 1_577_923_200, 1_578_009_600]  # 2020-01-01, 01-02, 01-03 UTC
    reviews = [amazon.review18("U1", f"I{k}", t) for k, t in enumerate(times)]
    meta = [amazon.meta18(f"I{k}", f"Item {k}") for k in range(3)]
    tables = amazon.read(tmp_path, reviews, meta, **window)
    assert tables.interactions["timestamp"].tolist() == expected
    assert tables.notes["reviews_outside_window"] == 3 - len(expected)


def test_window_applies_to_2023_milliseconds(tmp_path, amazon):
    day = 1_577_836_800_000  # 2020-01-01 in ms
    reviews = [
        amazon.review23("U1", "P1", day - 1),
        amazon.review23("U1", "P2", day),
        amazon.review23("U1", "P3", day + 1),
    ]
    meta = [amazon.meta23(f"P{k}", f"Item {k}") for k in (1, 2, 3)]
    tables = amazon.read(tmp_path, reviews, meta, start=dt.date(2020, 1, 1))
    # day - 1 ms truncates to the last second of 2019, outside the window
    assert amazon.triples(tables) == [("U1", "P2", 1_577_836_800), ("U1", "P3", 1_577_836_800)]


def test_duplicate_reviews_are_dropped_and_counted(tmp_path, amazon):
    reviews = [
        amazon.review18("U1", "I1", T0, 5.0),
        amazon.review18("U1", "I1", T0, 1.0),  # same user, item and time: duplicate (first kept)
        amazon.review18("U1", "I1", T0 + 10, 4.0),  # same pair, other time: kept
        amazon.review18("U2", "I1", T0, 3.0),
        amazon.review18("U2", "I1", T0, 3.0),
        amazon.review18("U2", "I1", T0, 3.0),
    ]
    tables = amazon.read(tmp_path, reviews, [amazon.meta18("I1", "One")])
    assert amazon.triples(tables) == [("U1", "I1", T0), ("U1", "I1", T0 + 10), ("U2", "I1", T0)]
    assert tables.interactions["rating"].tolist() == [5.0, 4.0, 3.0]
    assert tables.notes["duplicate_reviews"] == 3
    assert tables.notes["reviews_read"] == 6


def test_duplicates_are_dropped_before_k_core(tmp_path, amazon):
    # U1 reviews I1 twice at the same time: one distinct review, below k=2
    reviews = [amazon.review18("U1", "I1", T0), amazon.review18("U1", "I1", T0)]
    reviews += [
        amazon.review18(u, i, T0 + n)
        for n, (u, i) in enumerate(
            [("U2", "I1"), ("U2", "I2"), ("U3", "I1"), ("U3", "I2")], start=1
        )
    ]
    tables = amazon.read(
        tmp_path, reviews, [amazon.meta18("I1", "One"), amazon.meta18("I2", "Two")], k_core=2
    )
    assert sorted(tables.interactions["user_id"].unique()) == ["U2", "U3"]
    assert tables.notes["duplicate_reviews"] == 1
    assert tables.notes["reviews_removed_by_k_core"] == 1


def test_all_notes_together(tmp_path, amazon, cascade_reviews, cascade_meta):
    reviews = [
        *cascade_reviews,
        amazon.review18("u1", "A", T0),  # duplicate of the first
        amazon.review18("u1", "BAD", T0 + 50),  # item with a bad title
        amazon.review18("u9", "A", 100),  # before the window
    ]
    meta = [*cascade_meta, amazon.meta18("BAD", "")]
    tables = amazon.read(tmp_path, reviews, meta, k_core=2, start=dt.date(2017, 1, 1))
    assert tables.notes == {
        "reviews_read": 11,
        "items_bad_title": 1,
        "reviews_without_metadata": 1,
        "reviews_outside_window": 1,
        "duplicate_reviews": 1,
        "reviews_removed_by_k_core": 4,
        "duplicate_item_rows_dropped": 0,
    }
    assert len(tables.interactions) == 4


# ---------------------------------------------------------------------------- known gaps


def test_categories_are_html_unescaped(tmp_path, amazon):
    meta = [amazon.meta18("I1", "One", category=["Clothing, Shoes &amp; Jewelry", "Men"])]
    tables = amazon.read(tmp_path, [amazon.review18("U1", "I1", T0)], meta)
    assert tables.items["categories"].tolist() == ["Clothing, Shoes & Jewelry, Men"]


def test_min_rating_drops_are_counted(tmp_path, amazon):
    reviews = [amazon.review18("U1", "I1", T0, 5.0), amazon.review18("U1", "I2", T0 + 1, 2.0)]
    rpath = amazon.write_jsonl(tmp_path / "r.json", reviews)
    mpath = amazon.write_jsonl(
        tmp_path / "m.json", [amazon.meta18("I1", "One"), amazon.meta18("I2", "Two")]
    )
    amazon_cfg = AmazonConfig(reviews=rpath, meta=mpath, k_core=1)
    tables = read_source(IngestConfig(source="amazon", min_rating=4.0, amazon=amazon_cfg))
    assert len(tables.interactions) == 1
    assert tables.notes.get("interactions_below_min_rating") == 1
