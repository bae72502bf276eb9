"""The Amazon reviews reader (2018 and 2023 JSON lines): formats, gzip, and the item titles
it keeps."""

from __future__ import annotations

import json

import pytest

from sidrec.config import AmazonConfig
from sidrec.sources.amazon import read_amazon

T0 = 1_500_000_000  # 2017-07-14T02:40:00Z


# ---------------------------------------------------------------------------- formats


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_2018_format_reads_ids_times_ratings_and_item_text(tmp_path, gz, amazon):
    reviews = [
        amazon.review18("U1", "B001", T0, 5.0),
        amazon.review18("U1", "B002", T0 + 60, 3.0),
        amazon.review18("U2", "B001", T0 + 120, 4.0),
    ]
    meta = [
        amazon.meta18(
            "B001",
            "Duct Tape &amp; More",
            description=["First line.", "Second &lt;b&gt;line&lt;/b&gt;."],
            brand="Acme &amp; Co",
        ),
        amazon.meta18("B002", "Super Glue", description=[], brand="", category=[]),
    ]
    tables = amazon.read(tmp_path, reviews, meta, gz=gz)
    inter = tables.interactions
    assert inter.columns.tolist() == ["user_id", "item_id", "timestamp", "rating"]
    assert amazon.triples(tables) == [
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
    assert amazon.item_row(tables, "B001") == {
        "title": "Duct Tape & More",
        "description": "First line. Second <b>line</b>.",
        "brand": "Acme & Co",
        "categories": "Industrial & Scientific, Tapes",
    }
    assert amazon.item_row(tables, "B002") == {
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
def test_2023_format_uses_parent_asin_store_and_millisecond_times(tmp_path, gz, amazon):
    t_ms = 1_588_615_855_070  # 2020-05-04T18:10:55.070Z
    reviews = [
        amazon.review23("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT1", t_ms, 4.0),
        amazon.review23("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT2", t_ms + 999, 1.0),
        amazon.review23("AFQLNQNQYFWQZPJQZS6V3NZU4QBQ", "B0PARENT1", t_ms + 5_000, 5.0),
    ]
    meta = [
        amazon.meta23(
            "B0PARENT1",
            "Nitrile Gloves, 100 ct",
            store="SafeHands",
            description=["Powder free.", "Latex free."],
            categories=["Industrial & Scientific", "Lab Supplies"],
        ),
        amazon.meta23("B0PARENT2", "Safety Glasses"),
    ]
    tables = amazon.read(tmp_path, reviews, meta, gz=gz)
    assert amazon.triples(tables) == [
        ("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT1", 1_588_615_855),
        ("AGKHLEW2SOWHNMFQIJGBECAF7INQ", "B0PARENT2", 1_588_615_856),  # 855.070 + 0.999 s
        ("AFQLNQNQYFWQZPJQZS6V3NZU4QBQ", "B0PARENT1", 1_588_615_860),
    ]
    assert tables.interactions["rating"].tolist() == [4.0, 1.0, 5.0]
    # the variant asin is not used as the item id
    assert not tables.interactions["item_id"].str.endswith("-variant").any()
    assert amazon.item_row(tables, "B0PARENT1") == {
        "title": "Nitrile Gloves, 100 ct",
        "description": "Powder free. Latex free.",
        "brand": "SafeHands",
        "categories": "Industrial & Scientific, Lab Supplies",
    }
    assert amazon.item_row(tables, "B0PARENT2")["brand"] == "Acme"


def test_gzip_and_plain_give_identical_tables(tmp_path, amazon):
    reviews = [
        amazon.review18(f"U{u}", f"I{i}", T0 + 10 * u + i) for u in range(3) for i in range(3)
    ]
    meta = [amazon.meta18(f"I{i}", f"Item {i}") for i in range(3)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = amazon.read(tmp_path / "a", reviews, meta, k_core=3)
    packed = amazon.read(tmp_path / "b", reviews, meta, gz=True, k_core=3)
    assert plain.interactions.equals(packed.interactions)
    assert plain.items.equals(packed.items)
    assert len(plain.interactions) == 9


def test_blank_lines_are_skipped_and_string_times_accepted(tmp_path, amazon):
    rpath = tmp_path / "reviews.json"
    rpath.write_text(
        "\n"
        + json.dumps(amazon.review18("U1", "I1", T0))
        + "\n   \n"
        + json.dumps({**amazon.review18("U1", "I2", 0), "unixReviewTime": str(T0 + 5)})
        + "\n\n"
    )
    mpath = amazon.write_jsonl(
        tmp_path / "meta.json", [amazon.meta18("I1", "One"), amazon.meta18("I2", "Two")]
    )
    tables = read_amazon(AmazonConfig(reviews=rpath, meta=mpath, k_core=1))
    assert amazon.triples(tables) == [("U1", "I1", T0), ("U1", "I2", T0 + 5)]


# ---------------------------------------------------------------------------- title filters


def test_titles_are_unescaped_and_whitespace_collapsed(tmp_path, amazon):
    meta = [
        amazon.meta18("I1", "  Tom &amp; Jerry&#39;s \n\t Tape&nbsp;Roll  "),
        amazon.meta18("I2", "3&quot; Clamp &gt; 2&quot;"),
    ]
    reviews = [amazon.review18("U1", "I1", T0), amazon.review18("U1", "I2", T0 + 1)]
    tables = amazon.read(tmp_path, reviews, meta)
    assert tables.items.set_index("item_id")["title"].to_dict() == {
        "I1": "Tom & Jerry's Tape Roll",
        "I2": '3" Clamp > 2"',
    }


def test_items_with_empty_or_long_titles_are_dropped_with_their_reviews(tmp_path, amazon):
    meta = [
        amazon.meta18("OK3", "one two three"),  # exactly max_title_words: kept
        amazon.meta18("AMP", "one &amp; three"),  # 3 words after unescaping: kept
        amazon.meta18("LONG", "one two three four"),  # too long
        amazon.meta18("EMPTY", ""),
        amazon.meta18("BLANK", " &nbsp; \n "),  # whitespace only once unescaped
        amazon.meta18("NONE", None),
        amazon.meta18("LIST", ["not", "a", "string"]),
        {"asin": "MISSING", "description": ["no title key"]},
        amazon.meta18("NOREV", "never reviewed"),  # fine title but no reviews: not in the catalog
    ]
    items = ["OK3", "AMP", "LONG", "EMPTY", "BLANK", "NONE", "LIST", "MISSING", "GHOST"]
    reviews = [amazon.review18("U1", item, T0 + k) for k, item in enumerate(items)]
    reviews.append(amazon.review18("U2", "LONG", T0 + 100))
    tables = amazon.read(tmp_path, reviews, meta, max_title_words=3)
    assert tables.items["item_id"].tolist() == ["OK3", "AMP"]
    assert tables.items["title"].tolist() == ["one two three", "one & three"]
    assert amazon.triples(tables) == [("U1", "OK3", T0), ("U1", "AMP", T0 + 1)]
    notes = tables.notes
    assert notes["reviews_read"] == 10
    assert notes["items_bad_title"] == 6  # LONG, EMPTY, BLANK, NONE, LIST, MISSING
    assert notes["reviews_without_metadata"] == 8  # 7 of dropped items + GHOST
    assert notes["reviews_removed_by_k_core"] == 0
    assert "reviews_outside_window" not in notes


def test_default_max_title_words_is_20(tmp_path, amazon):
    words = [f"w{i}" for i in range(21)]
    meta = [amazon.meta18("I20", " ".join(words[:20])), amazon.meta18("I21", " ".join(words))]
    reviews = [amazon.review18("U1", "I20", T0), amazon.review18("U1", "I21", T0 + 1)]
    tables = amazon.read(tmp_path, reviews, meta)
    assert tables.items["item_id"].tolist() == ["I20"]
    assert tables.notes["items_bad_title"] == 1


def test_first_metadata_record_of_an_item_wins(tmp_path, amazon):
    meta = [amazon.meta18("I1", "First"), amazon.meta18("I1", "Second"), {"title": "no asin"}]
    tables = amazon.read(tmp_path, [amazon.review18("U1", "I1", T0)], meta)
    assert tables.items["title"].tolist() == ["First"]
