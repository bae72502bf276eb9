"""The Amazon reviews reader on bad input: each problem is an InputError naming the file and
what is wrong."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import pytest

from sidrec.config import AmazonConfig
from sidrec.errors import InputError
from sidrec.sources.amazon import read_amazon

T0 = 1_500_000_000  # 2017-07-14T02:40:00Z


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
def good_meta(tmp_path: Path, amazon) -> Path:
    return amazon.write_jsonl(tmp_path / "meta.json", [amazon.meta18("I1", "One")])


def test_missing_reviews_file(tmp_path, good_meta):
    path = tmp_path / "nope.json.gz"
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "reviews file does not exist")


def test_missing_meta_file(tmp_path, amazon):
    rpath = amazon.write_jsonl(tmp_path / "r.json", [amazon.review18("U1", "I1", T0)])
    path = tmp_path / "meta_missing.json"
    raises_for(AmazonConfig(reviews=rpath, meta=path), path, "metadata file does not exist")


def test_empty_files(tmp_path, good_meta, amazon):
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    raises_for(AmazonConfig(reviews=empty, meta=good_meta), empty, "empty (0 bytes)")
    rpath = amazon.write_jsonl(tmp_path / "r.json", [amazon.review18("U1", "I1", T0)])
    raises_for(AmazonConfig(reviews=rpath, meta=empty), empty, "metadata file is empty")


def test_blank_reviews_file_has_no_records(tmp_path, good_meta):
    path = tmp_path / "r.json"
    path.write_text("\n\n  \n")
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "reviews file has no records")


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_truncated_json_line_names_the_line(tmp_path, good_meta, gz, amazon):
    lines = [json.dumps(amazon.review18("U1", "I1", T0 + k)) for k in range(3)]
    text = "\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2]  # cut mid-record
    path = tmp_path / ("r.json.gz" if gz else "r.json")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "reviews line 3 is not valid JSON")


def test_broken_metadata_line_names_the_line(tmp_path, amazon):
    rpath = amazon.write_jsonl(tmp_path / "r.json", [amazon.review18("U1", "I1", T0)])
    mpath = tmp_path / "m.json"
    mpath.write_text(json.dumps(amazon.meta18("I1", "One")) + "\n{'asin': 'I2'}\n")
    raises_for(AmazonConfig(reviews=rpath, meta=mpath), mpath, "metadata line 2 is not valid JSON")


def test_json_line_that_is_not_an_object(tmp_path, good_meta, amazon):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(amazon.review18("U1", "I1", T0)) + "\n[1, 2, 3]\n")
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "line 2 is not a JSON object")


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        # gzip name, bytes that are not gzip at all
        ("r.json.gz", lambda amazon: b"this is not gzip data\n" * 4, "cannot be read"),
        # valid gzip wrapping binary garbage (invalid UTF-8)
        ("r.json.gz", lambda amazon: gzip.compress(bytes(range(128, 256)) * 8), "cannot be read"),
        # gzip stream cut short
        (
            "r.json.gz",
            lambda amazon: gzip.compress(
                b"".join(
                    json.dumps(amazon.review18("U", "I1", T0 + k)).encode() + b"\n"
                    for k in range(200)
                )
            )[:-40],
            "cannot be read",
        ),
        # gzip bytes under a plain name
        (
            "r.json",
            lambda amazon: gzip.compress(json.dumps(amazon.review18("U1", "I1", T0)).encode()),
            "cannot be read",
        ),
        # random-looking binary (deterministic), not UTF-8
        (
            "r.json",
            lambda amazon: bytes((i * 73 + 41) % 256 for i in range(4096)),
            "cannot be read after line 0",
        ),
        # ASCII control bytes: valid UTF-8, but line 1 is not JSON
        ("r.json", lambda amazon: bytes(range(1, 128)), "reviews line 1 is not valid JSON"),
        # an image
        (
            "r.json",
            lambda amazon: b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00",
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
def test_binary_garbage_is_an_input_error(tmp_path, good_meta, amazon, name, content, fragment):
    """``content(amazon)`` gives the file's bytes (some are built from review records)."""
    path = tmp_path / name
    path.write_bytes(content(amazon))
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, fragment)


def test_unknown_review_format(tmp_path, good_meta, amazon):
    path = amazon.write_jsonl(
        tmp_path / "r.json", [{"user": "U1", "item": "I1", "stars": 5, "time": T0}]
    )
    text = raises_for(
        AmazonConfig(reviews=path, meta=good_meta), path, "cannot tell the Amazon reviews format"
    )
    assert "['item', 'stars', 'time', 'user']" in text


def test_2023_reviews_need_user_id_as_well_as_parent_asin(tmp_path, good_meta, amazon):
    path = amazon.write_jsonl(
        tmp_path / "r.json", [{"parent_asin": "P1", "rating": 5, "timestamp": 1}]
    )
    raises_for(AmazonConfig(reviews=path, meta=good_meta), path, "cannot tell")


def test_metadata_of_the_other_format_has_no_item_ids(tmp_path, amazon):
    rpath = amazon.write_jsonl(tmp_path / "r.json", [amazon.review18("U1", "I1", T0)])
    mpath = amazon.write_jsonl(tmp_path / "m.json", [amazon.meta23("I1", "One")])
    raises_for(
        AmazonConfig(reviews=rpath, meta=mpath), mpath, "metadata file has no records with 'asin'"
    )
    rpath = amazon.write_jsonl(tmp_path / "r23.json", [amazon.review23("U1", "P1", T0 * 1000)])
    mpath = amazon.write_jsonl(tmp_path / "m18.json", [amazon.meta18("P1", "One")])
    raises_for(AmazonConfig(reviews=rpath, meta=mpath), mpath, "with 'parent_asin'")


def test_reviews_lacking_keys_name_rows(tmp_path, good_meta, amazon):
    good = amazon.review18("U1", "I1", T0)
    no_time = {k: v for k, v in amazon.review18("U2", "I1", T0).items() if k != "unixReviewTime"}
    no_item = {**amazon.review18("U3", "I1", T0), "asin": None}
    path = amazon.write_jsonl(tmp_path / "r.json", [good, no_time, no_item])
    text = raises_for(
        AmazonConfig(reviews=path, meta=good_meta),
        path,
        "2 review(s) lack reviewerID, asin or unixReviewTime",
    )
    assert "(rows 1, 2)" in text


def test_non_numeric_review_times(tmp_path, good_meta, amazon):
    bad = {**amazon.review18("U2", "I1", T0), "unixReviewTime": "07 14, 2017"}
    path = amazon.write_jsonl(tmp_path / "r.json", [amazon.review18("U1", "I1", T0), bad])
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


@pytest.mark.parametrize(
    ("version", "rating"),
    [("2018", "five"), ("2018", "inf"), ("2018", "NaN"), ("2023", "-inf"), ("2023", [5])],
    ids=["five", "inf", "NaN", "2023-minus-inf", "2023-list"],
)
def test_ratings_that_are_not_numbers(tmp_path, amazon, version, rating):
    """A text rating must not become a missing one, which ``min_rating`` would count as too low."""
    if version == "2018":
        reviews = [amazon.review18("U1", "I1", T0), amazon.review18("U2", "I1", T0, rating=rating)]
        meta, field = [amazon.meta18("I1", "One")], "overall"
    else:
        reviews = [amazon.review23("U1", "P1", T0 * 1000), amazon.review23("U2", "P1", 0, rating)]
        meta, field = [amazon.meta23("P1", "One")], "rating"
    rpath = amazon.write_jsonl(tmp_path / "r.json", reviews)
    mpath = amazon.write_jsonl(tmp_path / "m.json", meta)
    with pytest.raises(InputError) as err:
        read_amazon(AmazonConfig(reviews=rpath, meta=mpath), min_rating=4)
    text = str(err.value)
    assert text.startswith(f"{rpath}, column '{field}': 1 rating(s) are not numbers"), text
    assert f"(rows 1); sample values: {rating!r}" in text


@pytest.mark.parametrize("time", ["inf", "-Infinity", 1e30, 10**25])
def test_review_times_that_are_no_dates(tmp_path, good_meta, amazon, time):
    bad = {**amazon.review18("U2", "I1", T0), "unixReviewTime": time}
    path = amazon.write_jsonl(tmp_path / "r.json", [amazon.review18("U1", "I1", T0), bad])
    text = raises_for(
        AmazonConfig(reviews=path, meta=good_meta),
        path,
        "1 review time(s) are not numbers or not dates",
    )
    assert "column 'unixReviewTime'" in text and f"sample values: {time!r}" in text
