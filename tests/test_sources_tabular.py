from __future__ import annotations

import gzip

import pandas as pd
import pytest

from sidrec.errors import InputError
from sidrec.sources.common import parse_timestamps
from sidrec.sources.movielens import read_movielens_100k
from sidrec.sources.tabular import read_tabular


def test_movielens_100k_from_recbole_wheel():
    tables = read_movielens_100k()
    inter, items = tables.interactions, tables.items
    assert (inter["user_id"].nunique(), len(items), len(inter)) == (943, 1682, 100_000)
    toy = items.set_index("item_id").loc["1"]
    assert (toy["title"], toy["year"], toy["genres"]) == (
        "Toy Story",
        "1995",
        "Animation, Children's, Comedy",
    )
    assert inter["timestamp"].between(874_000_000, 894_000_000).all()
    assert len(read_movielens_100k(min_rating=4).interactions) == 55_375


def test_csv_source_normalizes_ids_timestamps_and_text(tmp_path, write_csv_dataset):
    inter, items = write_csv_dataset(
        tmp_path,
        "user_id,item_id,timestamp,rating\n 7 ,10,2020-01-02T00:00:00Z,5\n7,11,1600000000000,3\n8,10,1600000001,4\n",
        "item_id,title,brand,color\n10,  Ten ,Acme,red\n11,Eleven,,blue\n",
    )
    tables = read_tabular(inter, items)
    got = tables.interactions
    assert got["user_id"].tolist() == ["7", "7", "8"]
    assert got["timestamp"].tolist() == [1_577_923_200, 1_600_000_000, 1_600_000_001]
    assert got["rating"].tolist() == [5.0, 3.0, 4.0]
    assert tables.items.columns.tolist() == ["item_id", "title", "brand", "color"]
    assert tables.items["title"].tolist() == ["Ten", "Eleven"]


def test_parquet_source_with_float_ids(tmp_path):
    pd.DataFrame(
        {"user_id": [1.0, 2.0], "item_id": [3, 4], "timestamp": [1_600_000_000, 1_600_000_001]}
    ).to_parquet(tmp_path / "i.parquet")
    pd.DataFrame({"item_id": [3, 4], "title": ["c", "d"]}).to_parquet(tmp_path / "items.parquet")
    tables = read_tabular(tmp_path / "i.parquet", tmp_path / "items.parquet")
    assert tables.interactions["user_id"].tolist() == ["1", "2"]
    assert tables.items["item_id"].tolist() == ["3", "4"]


def test_exact_duplicate_catalog_rows_are_dropped_and_counted(tmp_path, write_csv_dataset):
    inter, items = write_csv_dataset(tmp_path, items="item_id,title\na,A\na,A\nb,B\nc,C\nd,D\n")
    tables = read_tabular(inter, items)
    assert len(tables.items) == 4
    assert tables.notes["duplicate_item_rows_dropped"] == 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        (b"", "empty (0 bytes)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", "looks binary"),
        (b"\xff\xfe\xfa garbage \xc3\x28 more", "not UTF-8"),
        (b"user_id;item_id;timestamp\n1;a;1600000000\n", "seems delimited by ';'"),
        (b"user_id,item\n1,a\n", "lacks required column(s) ['item_id', 'timestamp']"),
        (b'user_id,item_id,timestamp\n1,"a,1600000000\n', "not valid CSV"),
    ],
)
def test_unreadable_interactions_file_is_a_clear_error(
    tmp_path, content, expected, write_csv_dataset
):
    inter, items = write_csv_dataset(tmp_path)
    if content is None:
        inter.unlink()
    else:
        inter.write_bytes(content)
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    assert expected in str(err.value)
    assert str(inter) in str(err.value)


def test_unparseable_timestamps_name_rows_and_values(tmp_path, write_csv_dataset):
    inter, items = write_csv_dataset(
        tmp_path, "user_id,item_id,timestamp\n1,a,1600000000\n1,b,yesterday\n1,c,\n"
    )
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    text = str(err.value)
    assert "column 'timestamp'" in text and "1 timestamp(s) cannot be parsed" in text
    assert "rows 1" in text and "'yesterday'" in text


def test_parse_timestamps_units(tmp_path):
    values = pd.Series(["1600000000", "1600000000500", "2020-09-13 12:26:40", None])
    got = parse_timestamps(values, tmp_path / "x.csv", "timestamp")
    assert got.tolist()[:3] == [1_600_000_000, 1_600_000_000, 1_600_000_000]
    assert got.isna().tolist() == [False, False, False, True]


def test_bad_rating_and_min_rating_without_ratings(tmp_path, write_csv_dataset):
    inter, items = write_csv_dataset(
        tmp_path, "user_id,item_id,timestamp,rating\n1,a,1600000000,five\n"
    )
    with pytest.raises(InputError, match="column 'rating'.*not numbers"):
        read_tabular(inter, items)
    inter.write_text("user_id,item_id,timestamp\n1,a,1600000000\n")
    with pytest.raises(InputError, match="no rating column"):
        read_tabular(inter, items, min_rating=3)


def test_gzip_csv_is_rejected_with_a_hint(tmp_path, write_csv_dataset):
    inter, items = write_csv_dataset(tmp_path)
    inter.write_bytes(gzip.compress(inter.read_bytes()))
    with pytest.raises(InputError, match=str(inter)):
        read_tabular(inter, items)
