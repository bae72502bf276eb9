"""The Amazon reviews reader (2018 and 2023 JSON lines): formats, filters, k-core and errors."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from sidrec.config import AmazonConfig, IngestConfig
from sidrec.errors import InputError
from sidrec.sources import read_source
from sidrec.sources.amazon import k_core, read_amazon
from sidrec.sources.common import SourceTables

T0 = 1_500_000_000  # 2017-07-14T02:40:00Z


# ---------------------------------------------------------------------------- file builders


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    """JSON lines, gzip-compressed when the name ends in ``.gz``."""
    text = "".join(json.dumps(r) + "\n" for r in records)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path.write_text(text, encoding="utf-8")
    return path


def review18(user: str, item: str, t: int, rating: float = 5.0) -> dict[str, Any]:
    stamp = dt.datetime.fromtimestamp(t, dt.UTC)
    return {
        "reviewerID": user,
        "asin": item,
        "overall": rating,
        "unixReviewTime": t,
        "reviewTime": f"{stamp:%m %d, %Y}",
        "reviewerName": f"Name of {user}",
        "reviewText": "Works as described.",
        "summary": "Fine",
        "verified": True,
    }


def meta18(item: str, title: Any, **extra: Any) -> dict[str, Any]:
    record = {
        "asin": item,
        "title": title,
        "description": [f"About {item}."],
        "brand": "Acme",
        "category": ["Industrial & Scientific", "Tapes"],
        "price": "$9.99",
        "also_buy": [],
        "feature": ["Strong"],
    }
    record.update(extra)
    return record


def review23(user: str, item: str, t_ms: int, rating: float = 5.0) -> dict[str, Any]:
    return {
        "user_id": user,
        "parent_asin": item,
        "asin": item + "-variant",
        "rating": rating,
        "timestamp": t_ms,
        "title": "Great",
        "text": "Works as described.",
        "images": [],
        "helpful_vote": 2,
        "verified_purchase": True,
    }


def meta23(item: str, title: Any, **extra: Any) -> dict[str, Any]:
    record = {
        "parent_asin": item,
        "main_category": "Industrial & Scientific",
        "title": title,
        "average_rating": 4.5,
        "rating_number": 10,
        "features": ["Strong", "Cheap"],
        "description": [f"About {item}."],
        "price": 9.99,
        "store": "Acme",
        "categories": ["Industrial & Scientific", "Tapes"],
        "details": {"Color": "Black"},
    }
    record.update(extra)
    return record


def amazon(tmp_path: Path, reviews: list, meta: list, *, gz: bool = False, **cfg: Any):
    suffix = ".jsonl.gz" if gz else ".jsonl"
    rpath = write_jsonl(tmp_path / f"reviews{suffix}", reviews)
    mpath = write_jsonl(tmp_path / f"meta{suffix}", meta)
    cfg.setdefault("k_core", 1)
    return read_amazon(AmazonConfig(reviews=rpath, meta=mpath, **cfg))


def triples(tables: SourceTables) -> list[tuple[str, str, int]]:
    inter = tables.interactions
    return list(
        zip(inter["user_id"], inter["item_id"], inter["timestamp"].astype(int), strict=True)
    )


def item_row(tables: SourceTables, item: str) -> dict[str, Any]:
    return tables.items.set_index("item_id").loc[item].to_dict()


# ---------------------------------------------------------------------------- formats


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_2018_format_reads_ids_times_ratings_and_item_text(tmp_path, gz):
    reviews = [
        review18("U1", "B001", T0, 5.0),
        review18("U1", "B002", T0 + 60, 3.0),
        review18("U2", "B001", T0 + 120, 4.0),
    ]
    meta = [
        meta18(
            "B001",
            "Duct Tape &amp; More",
            description=["First line.", "Second &lt;b&gt;line&lt;/b&gt;."],
            brand="Acme &amp; Co",
        ),
        meta18("B002", "Super Glue", description=[], brand="", category=[]),
    ]
    tables = amazon(tmp_path, reviews, meta, gz=gz)
    inter = tables.interactions
    assert inter.columns.tolist() == ["user_id", "item_id", "timestamp", "rating"]
    assert triples(tables) == [
        ("U1", "B001", T0),
        ("U1", "B002", T0 + 60),
        ("U2", "B001", T0 + 120),
    ]
    assert inter["rating"].tolist() == [5.0, 3.0, 4.0]
    assert str(inter["timestamp"].dtype) == "Int64"
    assert tables.items.columns.tolist() == [
        "item_id",
        "title",
        "description",
        "brand",
        "categories",
    ]
    assert tables.items["item_id"].tolist() == ["B001", "B002"]
    assert item_row(tables, "B001") == {
        "title": "Duct Tape & More",
        "description": "First line. Second <b>line</b>.",
        "brand": "Acme & Co",
        "categories": "Industrial & Scientific, Tapes",
    }
    assert item_row(tables, "B002") == {
        "title": "Super Glue",
        "description": "",
        "brand": "",
        "categories": "",
    }
    assert tables.files == {
        "interactions": [tmp_path / f"reviews.jsonl{'.gz' if gz else ''}"],
        "items": [tmp_path / f"meta.jsonl{'.gz' if gz else ''}"],
    }
    assert tables.notes["reviews_read"] == 3


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_2023_format_uses_parent_asin_store_and_millisecond_times(tmp_path, gz):
    t_ms = 1_588_615_855_070  # 2020-05-04T18:10:55.070Z
    reviews = [
        review23("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT1", t_ms, 4.0),
        review23("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT2", t_ms + 999, 1.0),
        review23("AFQLNQNQYFWQZPJQZS6V3NZU4QBQ", "B0PARENT1", t_ms + 5_000, 5.0),
    ]
    meta = [
        meta23(
            "B0PARENT1",
            "Nitrile Gloves, 100 ct",
            store="SafeHands",
            description=["Powder free.", "Latex free."],
            categories=["Industrial & Scientific", "Lab Supplies"],
        ),
        meta23("B0PARENT2", "Safety Glasses"),
    ]
    tables = amazon(tmp_path, reviews, meta, gz=gz)
    assert triples(tables) == [
        ("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT1", 1_588_615_855),
        ("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT2", 1_588_615_856),  # 855.070 + 0.999 s
        ("AFQLNQNQYFWQZPJQZS6V3NZU4QBQ", "B0PARENT1", 1_588_615_860),
    ]
    assert tables.interactions["rating"].tolist() == [4.0, 1.0, 5.0]
    # the variant asin is not used as the item id
    assert not tables.interactions["item_id"].str.endswith("-variant").any()
    assert item_row(tables, "B0PARENT1") == {
        "title": "Nitrile Gloves, 100 ct",
        "description": "Powder free. Latex free.",
        "brand": "SafeHands",
        "categories": "Industrial & Scientific, Lab Supplies",
    }
    assert item_row(tables, "B0PARENT2")["brand"] == "Acme"


def test_gzip_and_plain_give_identical_tables(tmp_path):
    reviews = [review18(f"U{u}", f"I{i}", T0 + 10 * u + i) for u in range(3) for i in range(3)]
    meta = [meta18(f"I{i}", f"Item {i}") for i in range(3)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = amazon(tmp_path / "a", reviews, meta, k_core=3)
    packed = amazon(tmp_path / "b", reviews, meta, gz=True, k_core=3)
    assert plain.interactions.equals(packed.interactions)
    assert plain.items.equals(packed.items)
    assert len(plain.interactions) == 9


def test_blank_lines_are_skipped_and_string_times_accepted(tmp_path):
    rpath = tmp_path / "reviews.json"
    rpath.write_text(
        "\n"
        + json.dumps(review18("U1", "I1", T0))
        + "\n   \n"
        + json.dumps({**review18("U1", "I2", 0), "unixReviewTime": str(T0 + 5)})
        + "\n\n"
    )
    mpath = write_jsonl(tmp_path / "meta.json", [meta18("I1", "One"), meta18("I2", "Two")])
    tables = read_amazon(AmazonConfig(reviews=rpath, meta=mpath, k_core=1))
    assert triples(tables) == [("U1", "I1", T0), ("U1", "I2", T0 + 5)]


# ---------------------------------------------------------------------------- title filters


def test_titles_are_unescaped_and_whitespace_collapsed(tmp_path):
    meta = [
        meta18("I1", "  Tom &amp; Jerry&#39;s \n\t Tape&nbsp;Roll  "),
        meta18("I2", "3&quot; Clamp &gt; 2&quot;"),
    ]
    reviews = [review18("U1", "I1", T0), review18("U1", "I2", T0 + 1)]
    tables = amazon(tmp_path, reviews, meta)
    assert tables.items.set_index("item_id")["title"].to_dict() == {
        "I1": "Tom & Jerry's Tape Roll",
        "I2": '3" Clamp > 2"',
    }


def test_items_with_empty_or_long_titles_are_dropped_with_their_reviews(tmp_path):
    meta = [
        meta18("OK3", "one two three"),  # exactly max_title_words: kept
        meta18("AMP", "one &amp; three"),  # 3 words after unescaping: kept
        meta18("LONG", "one two three four"),  # too long
        meta18("EMPTY", ""),
        meta18("BLANK", " &nbsp; \n "),  # whitespace only once unescaped
        meta18("NONE", None),
        meta18("LIST", ["not", "a", "string"]),
        {"asin": "MISSING", "description": ["no title key"]},
        meta18("NOREV", "never reviewed"),  # fine title but no reviews: not in the catalog
    ]
    items = ["OK3", "AMP", "LONG", "EMPTY", "BLANK", "NONE", "LIST", "MISSING", "GHOST"]
    reviews = [review18("U1", item, T0 + k) for k, item in enumerate(items)]
    reviews.append(review18("U2", "LONG", T0 + 100))
    tables = amazon(tmp_path, reviews, meta, max_title_words=3)
    assert tables.items["item_id"].tolist() == ["OK3", "AMP"]
    assert tables.items["title"].tolist() == ["one two three", "one & three"]
    assert triples(tables) == [("U1", "OK3", T0), ("U1", "AMP", T0 + 1)]
    notes = tables.notes
    assert notes["reviews_read"] == 10
    assert notes["items_bad_title"] == 6  # LONG, EMPTY, BLANK, NONE, LIST, MISSING
    assert notes["reviews_without_metadata"] == 8  # 7 of dropped items + GHOST
    assert notes["reviews_removed_by_k_core"] == 0
    assert "reviews_outside_window" not in notes


def test_default_max_title_words_is_20(tmp_path):
    words = [f"w{i}" for i in range(21)]
    meta = [meta18("I20", " ".join(words[:20])), meta18("I21", " ".join(words))]
    reviews = [review18("U1", "I20", T0), review18("U1", "I21", T0 + 1)]
    tables = amazon(tmp_path, reviews, meta)
    assert tables.items["item_id"].tolist() == ["I20"]
    assert tables.notes["items_bad_title"] == 1


def test_first_metadata_record_of_an_item_wins(tmp_path):
    meta = [meta18("I1", "First"), meta18("I1", "Second"), {"title": "no asin"}]
    tables = amazon(tmp_path, [review18("U1", "I1", T0)], meta)
    assert tables.items["title"].tolist() == ["First"]


# ---------------------------------------------------------------------------- k-core


def cascade_reviews() -> list[dict[str, Any]]:
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
    return [review18(u, i, T0 + n) for n, (u, i) in enumerate(pairs)]


CASCADE_META = [meta18(i, f"Item {i}") for i in "ABCD"]


def test_k_core_is_iterated_until_stable(tmp_path):
    tables = amazon(tmp_path, cascade_reviews(), CASCADE_META, k_core=2)
    assert triples(tables) == [
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


def test_k_core_one_keeps_everything_and_three_removes_everything(tmp_path):
    kept = amazon(tmp_path, cascade_reviews(), CASCADE_META, k_core=1)
    assert len(kept.interactions) == 8
    assert kept.items["item_id"].tolist() == ["A", "B", "C", "D"]
    assert kept.notes["reviews_removed_by_k_core"] == 0
    gone = amazon(tmp_path, cascade_reviews(), CASCADE_META, k_core=3)
    assert gone.interactions.empty and gone.items.empty
    assert gone.notes["reviews_removed_by_k_core"] == 8


def test_k_core_function_on_a_frame():
    import pandas as pd

    df = pd.DataFrame(
        [(r["reviewerID"], r["asin"]) for r in cascade_reviews()], columns=["user_id", "item_id"]
    )
    core = k_core(df, 2)
    assert sorted(zip(core["user_id"], core["item_id"], strict=True)) == [
        ("u1", "A"),
        ("u1", "B"),
        ("u2", "A"),
        ("u2", "B"),
    ]
    assert core.index.tolist() == [0, 1, 2, 3]


def test_default_k_core_is_5(tmp_path):
    # 5 users x 5 items is a 5-core; a 6th user with 4 reviews is not
    reviews = [review18(f"U{u}", f"I{i}", T0 + 10 * u + i) for u in range(5) for i in range(5)]
    reviews += [review18("U5", f"I{i}", T0 + 100 + i) for i in range(4)]
    meta = [meta18(f"I{i}", f"Item {i}") for i in range(5)]
    rpath = write_jsonl(tmp_path / "r.json", reviews)
    mpath = write_jsonl(tmp_path / "m.json", meta)
    tables = read_amazon(AmazonConfig(reviews=rpath, meta=mpath))
    assert sorted(tables.interactions["user_id"].unique()) == ["U0", "U1", "U2", "U3", "U4"]
    assert len(tables.interactions) == 25
    assert tables.notes["reviews_removed_by_k_core"] == 4


def test_min_rating_is_applied_before_k_core(tmp_path):
    # u1's low rating of B leaves u1 with one review: with k=2 u1 disappears entirely
    reviews = [
        review18("u1", "A", T0, 5.0),
        review18("u1", "B", T0 + 1, 2.0),
        review18("u2", "A", T0 + 2, 5.0),
        review18("u2", "B", T0 + 3, 4.0),
        review18("u3", "A", T0 + 4, 4.0),
        review18("u3", "B", T0 + 5, 5.0),
    ]
    rpath = write_jsonl(tmp_path / "r.json", reviews)
    mpath = write_jsonl(tmp_path / "m.json", [meta18("A", "Alpha"), meta18("B", "Beta")])
    cfg = IngestConfig(
        source="amazon", min_rating=4.0, amazon=AmazonConfig(reviews=rpath, meta=mpath, k_core=2)
    )
    tables = read_source(cfg)
    assert triples(tables) == [
        ("u2", "A", T0 + 2),
        ("u2", "B", T0 + 3),
        ("u3", "A", T0 + 4),
        ("u3", "B", T0 + 5),
    ]
    assert (tables.interactions["rating"] >= 4.0).all()
    assert tables.notes["reviews_removed_by_k_core"] == 1  # u1's remaining review of A


# ---------------------------------------------------------------------------- window, duplicates


def test_time_window_keeps_start_and_excludes_end(tmp_path):
    start = 1_577_836_800  # 2020-01-01T00:00:00Z
    end = 1_578_009_600  # 2020-01-03T00:00:00Z
    times = [start - 1, start, start + 86_400, end - 1, end, end + 86_400]
    reviews = [review18("U1", f"I{k}", t) for k, t in enumerate(times)]
    meta = [meta18(f"I{k}", f"Item {k}") for k in range(len(times))]
    tables = amazon(tmp_path, reviews, meta, start=dt.date(2020, 1, 1), end=dt.date(2020, 1, 3))
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
def test_open_ended_time_window(tmp_path, window, expected):
    times = [1_577_836_800, 1_577_923_200, 1_578_009_600]  # 2020-01-01, 01-02, 01-03 UTC
    reviews = [review18("U1", f"I{k}", t) for k, t in enumerate(times)]
    meta = [meta18(f"I{k}", f"Item {k}") for k in range(3)]
    tables = amazon(tmp_path, reviews, meta, **window)
    assert tables.interactions["timestamp"].tolist() == expected
    assert tables.notes["reviews_outside_window"] == 3 - len(expected)


def test_window_applies_to_2023_milliseconds(tmp_path):
    day = 1_577_836_800_000  # 2020-01-01 in ms
    reviews = [
        review23("U1", "P1", day - 1),
        review23("U1", "P2", day),
        review23("U1", "P3", day + 1),
    ]
    meta = [meta23(f"P{k}", f"Item {k}") for k in (1, 2, 3)]
    tables = amazon(tmp_path, reviews, meta, start=dt.date(2020, 1, 1))
    # day - 1 ms truncates to the last second of 2019, outside the window
    assert triples(tables) == [("U1", "P2", 1_577_836_800), ("U1", "P3", 1_577_836_800)]


def test_duplicate_reviews_are_dropped_and_counted(tmp_path):
    reviews = [
        review18("U1", "I1", T0, 5.0),
        review18("U1", "I1", T0, 1.0),  # same user, item and time: duplicate (first kept)
        review18("U1", "I1", T0 + 10, 4.0),  # same pair, other time: kept
        review18("U2", "I1", T0, 3.0),
        review18("U2", "I1", T0, 3.0),
        review18("U2", "I1", T0, 3.0),
    ]
    tables = amazon(tmp_path, reviews, [meta18("I1", "One")])
    assert triples(tables) == [("U1", "I1", T0), ("U1", "I1", T0 + 10), ("U2", "I1", T0)]
    assert tables.interactions["rating"].tolist() == [5.0, 4.0, 3.0]
    assert tables.notes["duplicate_reviews"] == 3
    assert tables.notes["reviews_read"] == 6


def test_duplicates_are_dropped_before_k_core(tmp_path):
    # U1 reviews I1 twice at the same time: one distinct review, below k=2
    reviews = [review18("U1", "I1", T0), review18("U1", "I1", T0)]
    reviews += [
        review18(u, i, T0 + n)
        for n, (u, i) in enumerate(
            [("U2", "I1"), ("U2", "I2"), ("U3", "I1"), ("U3", "I2")], start=1
        )
    ]
    tables = amazon(tmp_path, reviews, [meta18("I1", "One"), meta18("I2", "Two")], k_core=2)
    assert sorted(tables.interactions["user_id"].unique()) == ["U2", "U3"]
    assert tables.notes["duplicate_reviews"] == 1
    assert tables.notes["reviews_removed_by_k_core"] == 1


def test_all_notes_together(tmp_path):
    reviews = [
        *cascade_reviews(),
        review18("u1", "A", T0),  # duplicate of the first
        review18("u1", "BAD", T0 + 50),  # item with a bad title
        review18("u9", "A", 100),  # before the window
    ]
    meta = [*CASCADE_META, meta18("BAD", "")]
    tables = amazon(tmp_path, reviews, meta, k_core=2, start=dt.date(2017, 1, 1))
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


def test_categories_are_html_unescaped(tmp_path):
    meta = [meta18("I1", "One", category=["Clothing, Shoes &amp; Jewelry", "Men"])]
    tables = amazon(tmp_path, [review18("U1", "I1", T0)], meta)
    assert tables.items["categories"].tolist() == ["Clothing, Shoes & Jewelry, Men"]


def test_min_rating_drops_are_counted(tmp_path):
    reviews = [review18("U1", "I1", T0, 5.0), review18("U1", "I2", T0 + 1, 2.0)]
    rpath = write_jsonl(tmp_path / "r.json", reviews)
    mpath = write_jsonl(tmp_path / "m.json", [meta18("I1", "One"), meta18("I2", "Two")])
    amazon_cfg = AmazonConfig(reviews=rpath, meta=mpath, k_core=1)
    tables = read_source(IngestConfig(source="amazon", min_rating=4.0, amazon=amazon_cfg))
    assert len(tables.interactions) == 1
    assert tables.notes.get("interactions_below_min_rating") == 1


# ---------------------------------------------------------------------------- errors


def raises_for(cfg: AmazonConfig, path: Path, *fragments: str) -> str:
    with pytest.raises(InputError) as err:
        read_amazon(cfg)
    text = str(err.value)
    assert str(path) in text, text
    assert err.value.path == path
    for fragment in fragments:
        assert fragment in text, text
    return text


@pytest.fixture
def good_meta(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "meta.json", [meta18("I1", "One")])


def test_missing_reviews_file(tmp_path, good_meta):
    path = tmp_path / "nope.json.gz"
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "reviews file does not exist")


def test_missing_meta_file(tmp_path):
    rpath = write_jsonl(tmp_path / "r.json", [review18("U1", "I1", T0)])
    path = tmp_path / "meta_missing.json"
    raises_for(AmazonConfig(reviews=rpath, meta=path), path, "metadata file does not exist")


def test_empty_files(tmp_path, good_meta):
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    raises_for(AmazonConfig(reviews=empty, meta=good_meta), empty, "empty (0 bytes)")
    rpath = write_jsonl(tmp_path / "r.json", [review18("U1", "I1", T0)])
    raises_for(AmazonConfig(reviews=rpath, meta=empty), empty, "metadata file is empty")


def test_blank_reviews_file_has_no_records(tmp_path, good_meta):
    path = tmp_path / "r.json"
    path.write_text("\n\n  \n")
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "reviews file has no records")


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_truncated_json_line_names_the_line(tmp_path, good_meta, gz):
    lines = [json.dumps(review18("U1", "I1", T0 + k)) for k in range(3)]
    text = "\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2]  # cut mid-record
    path = tmp_path / ("r.json.gz" if gz else "r.json")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "reviews line 3 is not valid JSON")


def test_broken_metadata_line_names_the_line(tmp_path):
    rpath = write_jsonl(tmp_path / "r.json", [review18("U1", "I1", T0)])
    mpath = tmp_path / "m.json"
    mpath.write_text(json.dumps(meta18("I1", "One")) + "\n{'asin': 'I2'}\n")
    raises_for(AmazonConfig(reviews=rpath, meta=mpath), mpath, "metadata line 2 is not valid JSON")


def test_json_line_that_is_not_an_object(tmp_path, good_meta):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(review18("U1", "I1", T0)) + "\n[1, 2, 3]\n")
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "line 2 is not a JSON object")


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        # gzip name, bytes that are not gzip at all
        ("r.json.gz", b"this is not gzip data\n" * 4, "cannot be read"),
        # valid gzip wrapping binary garbage (invalid UTF-8)
        ("r.json.gz", gzip.compress(bytes(range(128, 256)) * 8), "cannot be read"),
        # gzip stream cut short
        (
            "r.json.gz",
            gzip.compress(
                b"".join(
                    json.dumps(review18("U", "I1", T0 + k)).encode() + b"\n" for k in range(200)
                )
            )[:-40],
            "cannot be read",
        ),
        # gzip bytes under a plain name
        ("r.json", gzip.compress(json.dumps(review18("U1", "I1", T0)).encode()), "cannot be read"),
        # random-looking binary (deterministic), not UTF-8
        ("r.json", bytes((i * 73 + 41) % 256 for i in range(4096)), "cannot be read after line 0"),
        # ASCII control bytes: valid UTF-8, but line 1 is not JSON
        ("r.json", bytes(range(1, 128)), "reviews line 1 is not valid JSON"),
        # an image
        (
            "r.json",
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00",
            "cannot be read after line 0",
        ),
    ],
    ids=[
        "not-gzip",
        "gzip-of-garbage",
        "truncated-gzip",
        "gzip-unnamed",
        "random",
        "control",
        "png",
    ],
)
def test_binary_garbage_is_an_input_error(tmp_path, good_meta, name, content, fragment):
    path = tmp_path / name
    path.write_bytes(content)
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, fragment)


def test_unknown_review_format(tmp_path, good_meta):
    path = write_jsonl(tmp_path / "r.json", [{"user": "U1", "item": "I1", "stars": 5, "time": T0}])
    text = raises_for(
        AmazonConfig(reviews=path, meta=good_meta), path, "cannot tell the Amazon reviews format"
    )
    assert "['item', 'stars', 'time', 'user']" in text


def test_2023_reviews_need_user_id_as_well_as_parent_asin(tmp_path, good_meta):
    path = write_jsonl(tmp_path / "r.json", [{"parent_asin": "P1", "rating": 5, "timestamp": 1}])
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "cannot tell")


def test_metadata_of_the_other_format_has_no_item_ids(tmp_path):
    rpath = write_jsonl(tmp_path / "r.json", [review18("U1", "I1", T0)])
    mpath = write_jsonl(tmp_path / "m.json", [meta23("I1", "One")])
    raises_for(
        AmazonConfig(reviews=rpath, meta=mpath), mpath, "metadata file has no records with 'asin'"
    )
    rpath = write_jsonl(tmp_path / "r23.json", [review23("U1", "P1", T0 * 1000)])
    mpath = write_jsonl(tmp_path / "m18.json", [meta18("P1", "One")])
    raises_for(AmazonConfig(reviews=rpath, meta=mpath), mpath, "with 'parent_asin'")


def test_reviews_lacking_keys_name_rows(tmp_path, good_meta):
    good = review18("U1", "I1", T0)
    no_time = {k: v for k, v in review18("U2", "I1", T0).items() if k != "unixReviewTime"}
    no_item = {**review18("U3", "I1", T0), "asin": None}
    path = write_jsonl(tmp_path / "r.json", [good, no_time, no_item])
    text = raises_for(
        AmazonConfig(reviews=path, meta=good_meta),
        path,
        "2 review(s) lack reviewerID, asin or unixReviewTime",
    )
    assert "(rows 1, 2)" in text


def test_non_numeric_review_times(tmp_path, good_meta):
    bad = {**review18("U2", "I1", T0), "unixReviewTime": "07 14, 2017"}
    path = write_jsonl(tmp_path / "r.json", [review18("U1", "I1", T0), bad])
    text = raises_for(
        AmazonConfig(reviews=path, meta=good_meta), path, "1 review time(s) are not numbers"
    )
    assert "column 'unixReviewTime'" in text and "'07 14, 2017'" in text


def test_config_rejects_inverted_window(tmp_path):
    with pytest.raises(ValueError, match="must be before"):
        AmazonConfig(
            reviews=tmp_path / "r",
            meta=tmp_path / "m",
            start=dt.date(2020, 2, 1),
            end=dt.date(2020, 1, 1),
        )
