from __future__ import annotations

import gzip

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sidrec.errors import InputError
from sidrec.sources.common import parse_timestamps
from sidrec.sources.tabular import read_tabular


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


@pytest.mark.parametrize("value", ["inf", "-inf", "1e30", "-1e30"])
def test_timestamps_that_are_no_dates_are_unparseable(tmp_path, write_csv_dataset, value):
    inter, items = write_csv_dataset(
        tmp_path, f"user_id,item_id,timestamp\n1,a,1600000000500\n1,b,{value}\n"
    )
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    text = str(err.value)
    assert str(inter) in text and "column 'timestamp'" in text
    assert (
        "1 timestamp(s) cannot be parsed" in text and f"(rows 1); sample values: '{value}'" in text
    )


def test_float_timestamps_too_large_for_a_date_from_parquet(tmp_path, write_csv_dataset):
    _, items = write_csv_dataset(tmp_path)
    inter = tmp_path / "i.parquet"
    pd.DataFrame(
        {"user_id": ["1", "1"], "item_id": ["a", "b"], "timestamp": [1.6e9, 1e30]}
    ).to_parquet(inter)
    with pytest.raises(InputError, match=r"column 'timestamp'.*cannot be parsed.*'1e\+30'"):
        read_tabular(inter, items)


@pytest.mark.parametrize(
    ("value", "shown"), [("inf", "'inf'"), ("-inf", "'-inf'"), ("Infinity", "'Infinity'")]
)
def test_infinite_ratings_are_not_numbers(tmp_path, write_csv_dataset, value, shown):
    inter, items = write_csv_dataset(
        tmp_path, f"user_id,item_id,timestamp,rating\n1,a,1600000000,4\n1,b,1600000001,{value}\n"
    )
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    text = str(err.value)
    assert (
        str(inter) in text and "column 'rating'" in text and "1 rating(s) are not numbers" in text
    )
    assert f"(rows 1); sample values: {shown}" in text


def test_nan_rating_text_in_parquet_is_not_a_number(tmp_path, write_csv_dataset):
    """In CSV, "nan" is one of pandas' missing-value markers (like an empty cell); in a Parquet
    string column it is text, which is no rating."""
    _, items = write_csv_dataset(tmp_path)
    inter = tmp_path / "i.parquet"
    pd.DataFrame(
        {"user_id": ["1", "1"], "item_id": ["a", "b"], "timestamp": [1, 2], "rating": ["4", "nan"]}
    ).to_parquet(inter)
    with pytest.raises(InputError, match=r"i\.parquet, column 'rating'.*not numbers.*'nan'"):
        read_tabular(inter, items)


def test_binary_extra_item_column_is_dropped(tmp_path, write_csv_dataset):
    inter, _ = write_csv_dataset(tmp_path)
    items = tmp_path / "items.parquet"
    pd.DataFrame(
        {
            "item_id": list("abcd"),
            "title": list("ABCD"),
            "image": [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"", None],
            "color": ["red", "blue", "green", "grey"],
        }
    ).to_parquet(items)
    tables = read_tabular(inter, items)
    assert tables.items.columns.tolist() == ["item_id", "title", "color"]
    assert tables.notes["binary_item_columns_dropped"] == 1


@pytest.mark.parametrize("column", ["title", "categories", "item_id"])
def test_binary_value_in_a_column_the_pipeline_reads(tmp_path, write_csv_dataset, column):
    inter, _ = write_csv_dataset(tmp_path)
    items = tmp_path / "items.parquet"
    frame = pd.DataFrame(
        {"item_id": list("abcd"), "title": list("ABCD"), "categories": list("wxyz")}
    )
    frame[column] = [b"ok", b"\x89PNG\r\n\x1a\n" + bytes(1000), b"c", b"d"]
    frame.to_parquet(items)
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    text = str(err.value)
    assert f"{items}, column '{column}': 1 value(s) are binary data" in text
    assert "(rows 1); sample values: b'\\x89PNG\\r\\n\\x1a\\n\\x00" in text and len(text) < 400


def test_binary_user_ids_are_an_input_error(tmp_path, write_csv_dataset):
    _, items = write_csv_dataset(tmp_path)
    inter = tmp_path / "i.parquet"
    pd.DataFrame({"user_id": [b"\xff\xfe"], "item_id": ["a"], "timestamp": [1]}).to_parquet(inter)
    with pytest.raises(InputError, match=r"i\.parquet, column 'user_id': 1 value\(s\) are binary"):
        read_tabular(inter, items)


def test_list_text_fields_are_joined(tmp_path, write_csv_dataset):
    inter, _ = write_csv_dataset(tmp_path)
    items = tmp_path / "items.parquet"
    pd.DataFrame(
        {
            "item_id": list("abcd"),
            "title": ["A", "B", "C", "D"],
            "description": [["Strong.", "Sticky."], None, [], ["Plain."]],
            "categories": [["Tools", "Tapes"], ["Tools"], ["Tools", None, "Glue"], None],
        }
    ).to_parquet(items)
    got = read_tabular(inter, items).items
    assert got["categories"].tolist() == ["Tools, Tapes", "Tools", "Tools, Glue", pd.NA]
    assert got["description"].tolist() == ["Strong., Sticky.", pd.NA, "", "Plain."]


@pytest.mark.parametrize("table", ["interactions", "items"])
def test_list_ids_are_an_input_error(tmp_path, write_csv_dataset, table):
    inter, items = write_csv_dataset(tmp_path)
    if table == "items":
        items = tmp_path / "items.parquet"
        pd.DataFrame({"item_id": [["a", "b"], ["c"]], "title": ["AB", "C"]}).to_parquet(items)
        path = items
    else:
        inter = tmp_path / "i.parquet"
        pd.DataFrame({"user_id": ["1"], "item_id": [["a", "b"]], "timestamp": [1]}).to_parquet(
            inter
        )
        path = inter
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    text = str(err.value)
    assert f"{path}, column 'item_id'" in text and "id(s) are lists" in text
    assert "sample values: ['a', 'b']" in text


@pytest.mark.parametrize(
    "header", ["user_id,item_id,timestamp,timestamp", "user_id,item_id,timestamp, timestamp "]
)
def test_duplicate_csv_column_names_are_rejected(tmp_path, write_csv_dataset, header):
    inter, items = write_csv_dataset(tmp_path, f"{header}\n1,a,1600000000,1600000001\n")
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    assert str(err.value).startswith(
        f"{inter}, column 'timestamp': interactions file has duplicate column name(s) ['timestamp']"
    )


def test_duplicate_parquet_column_names_read_like_csv(tmp_path, write_csv_dataset):
    _, items = write_csv_dataset(tmp_path)
    inter = tmp_path / "i.parquet"
    columns = [pa.array(["1"]), pa.array(["a"]), pa.array([1]), pa.array([2])]
    pq.write_table(pa.table(columns, names=["user_id", "item_id", "timestamp", "timestamp"]), inter)
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    assert str(err.value).startswith(
        f"{inter}, column 'timestamp': interactions file has duplicate column name(s) ['timestamp']"
    )


def test_blank_csv_header_names_are_no_duplicates(tmp_path, write_csv_dataset):
    inter, items = write_csv_dataset(tmp_path, "user_id,item_id,timestamp,,\n1,a,1600000000,,\n")
    assert read_tabular(inter, items).interactions["timestamp"].tolist() == [1_600_000_000]
    assert read_tabular(inter, items).notes["blank_header_columns_dropped"] == 2


@pytest.mark.parametrize(
    "body, line",
    [
        ("1,a,1600000000,\n1,b,1600000001,\n", 2),  # a trailing comma on every row
        ("Smith, J,a,1600000000\n2,b,1600000001\n", 2),  # an unquoted comma in the first row
    ],
)
def test_rows_with_more_fields_than_the_header_are_refused(tmp_path, write_csv_dataset, body, line):
    # pandas would take the surplus first field as an index and shift every column by one
    inter, items = write_csv_dataset(tmp_path, "user_id,item_id,timestamp\n" + body)
    with pytest.raises(InputError) as err:
        read_tabular(inter, items)
    assert str(err.value).startswith(
        f"{inter}: interactions file has rows with more fields than its header's 3 "
        f"(first at line {line})"
    )


def test_only_blank_csv_fields_are_missing(tmp_path, write_csv_dataset):
    inter, items = write_csv_dataset(
        tmp_path,
        "user_id,item_id,timestamp\nNA,a,1600000000\nNA,b,1600000001\n",
        "item_id,title,description\na,None,N/A\nb,null,\nc,nan,x\nd,NA,y\n",
    )
    tables = read_tabular(inter, items)
    assert tables.interactions["user_id"].tolist() == ["NA", "NA"]
    assert tables.items["title"].tolist() == ["None", "null", "nan", "NA"]
    assert tables.items["description"].isna().tolist() == [False, True, False, False]


def test_a_saved_pandas_index_is_no_item_text(tmp_path, write_csv_dataset):
    inter, _ = write_csv_dataset(tmp_path)
    items = tmp_path / "indexed.csv"
    pd.DataFrame({"item_id": list("abcd"), "title": list("ABCD")}).to_csv(items)  # ",item_id,title"
    tables = read_tabular(inter, items)
    assert tables.items.columns.tolist() == ["item_id", "title"]
    assert tables.notes["blank_header_columns_dropped"] == 1


@pytest.mark.parametrize("value", ["03/04/2020", "13/04/2020", "3.4.20", "13-04-2020 10:00"])
def test_dates_that_do_not_say_day_or_month_first_are_refused(tmp_path, value):
    values = pd.Series(["2020-04-03", value, "1600000000"])
    with pytest.raises(InputError) as err:
        parse_timestamps(values, tmp_path / "x.csv", "timestamp")
    text = str(err.value)
    assert "1 timestamp(s) are dates with the day and the month" in text and "ISO 8601" in text
    assert "column 'timestamp'" in text and f"(rows 1); sample values: '{value}'" in text


def test_iso_and_named_month_dates_still_parse(tmp_path):
    values = pd.Series(["2020-04-03", "2020/04/03 00:00:00", "3 Apr 2020", "April 3, 2020"])
    got = parse_timestamps(values, tmp_path / "x.csv", "timestamp")
    assert got.tolist() == [1_585_872_000] * 4
