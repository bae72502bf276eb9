"""The MiniOneRec folder reader, against the real (trimmed) sample in tests/fixtures."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sidrec.errors import InputError
from sidrec.sources.common import SourceTables
from sidrec.sources.minionerec import SYNTHETIC_EPOCH, read_minionerec
from tasks.ingest import ingest

MINIONEREC_SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "minionerec-sample"
STEM = "Industrial_and_Scientific_5_2016-10-2018-11"
VALID_CSV = MINIONEREC_SAMPLE / "valid" / f"{STEM}.csv"
TEST_CSV = MINIONEREC_SAMPLE / "test" / f"{STEM}.csv"
ITEM_JSON = MINIONEREC_SAMPLE / "index" / "Industrial_and_Scientific.item.json"
INFO_TXT = MINIONEREC_SAMPLE / "info" / f"{STEM}.txt"


@pytest.fixture(scope="module")
def sample() -> SourceTables:
    return read_minionerec(MINIONEREC_SAMPLE)


def split_rows() -> pd.DataFrame:
    """valid then test rows, read independently of the reader under test."""
    frames = [pd.read_csv(p, dtype=str) for p in (VALID_CSV, TEST_CSV)]
    return pd.concat(frames, ignore_index=True)


def copy_sample(tmp_path: Path) -> Path:
    dest = tmp_path / "mini"
    shutil.copytree(MINIONEREC_SAMPLE, dest)
    for path in [dest, *dest.rglob("*")]:  # the fixture is read-only; the copy must not be
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


# ---------------------------------------------------------------------------- catalog


def test_catalog_is_the_item_json_with_its_titles(sample):
    items = sample.items
    catalog = json.loads(ITEM_JSON.read_text(encoding="utf-8"))
    assert len(catalog) == 283
    assert len(items) == 283
    assert items["item_id"].is_unique
    assert items.columns.tolist() == ["item_id", "title", "description", "brand", "categories"]
    assert set(items["item_id"]) == set(catalog)
    by_id = items.set_index("item_id")
    assert by_id["title"].to_dict() == {k: v["title"].strip() for k, v in catalog.items()}
    assert by_id.loc["3", "title"] == (
        "Kreg SML-C125-500 1-1/4-Inch #8 Coarse Pocket Hole Screws with Washer-Head, 500-Pack"
    )
    assert by_id.loc["3", "brand"] == "Kreg"
    assert by_id.loc["3", "description"].startswith("['Kreg SML-C125-500")
    assert (items["title"].str.len() > 0).all()
    assert sample.files["items"] == [ITEM_JSON]


def test_catalog_falls_back_to_the_info_file_without_item_json(tmp_path):
    folder = copy_sample(tmp_path)
    (folder / "index" / ITEM_JSON.name).unlink()
    info = folder / "info" / INFO_TXT.name
    lines = info.read_text(encoding="utf-8").splitlines()
    # make one title distinguishable from the .item.json one, to prove where it comes from
    sid, _, item = lines[0].split("\t")
    lines[0] = f"{sid}\t  Renamed from the info file  \t{item}"
    info.write_text("\n".join(lines) + "\n", encoding="utf-8")

    tables = read_minionerec(folder)
    items = tables.items
    assert items.columns.tolist() == ["item_id", "title"]
    assert len(items) == 283
    expected = {p[2].strip(): p[1].strip() for p in (ln.split("\t") for ln in lines)}
    assert items.set_index("item_id")["title"].to_dict() == expected
    assert expected[item] == "Renamed from the info file"
    assert tables.files["items"] == [info]
    # interactions do not depend on where the catalog came from
    assert tables.interactions.equals(read_minionerec(MINIONEREC_SAMPLE).interactions)


def test_info_titles_match_item_json_titles():
    catalog = json.loads(ITEM_JSON.read_text(encoding="utf-8"))
    info = [ln.split("\t") for ln in INFO_TXT.read_text(encoding="utf-8").splitlines()]
    assert len(info) == 283
    assert {item: title for _, title, item in info} == {k: v["title"] for k, v in catalog.items()}


# ---------------------------------------------------------------------------- interactions


def test_every_interaction_item_is_in_the_catalog(sample):
    inter = sample.interactions
    assert inter.columns.tolist() == ["user_id", "item_id", "timestamp"]
    assert inter[["user_id", "item_id", "timestamp"]].notna().all().all()
    assert set(inter["item_id"]) <= set(sample.items["item_id"])


def test_users_are_the_distinct_users_of_the_csvs(sample):
    rows = split_rows()
    expected = set(rows["user_id"])
    assert len(expected) == 51
    assert set(sample.interactions["user_id"]) == expected


def test_interaction_count_is_first_histories_plus_all_targets(sample):
    rows = split_rows()
    first = rows.drop_duplicates("user_id", keep="first")
    history_len = sum(len(ast.literal_eval(h)) for h in first["history_item_id"])
    assert len(sample.interactions) == history_len + len(rows) == 321


def test_sequence_of_one_user_is_first_history_then_targets(sample):
    user = "A5901"  # six consecutive valid samples
    rows = split_rows()
    mine = rows[rows["user_id"] == user]
    assert len(mine) == 6
    expected = [str(i) for i in ast.literal_eval(mine["history_item_id"].iloc[0])]
    expected += mine["item_id"].tolist()
    assert expected == ["79", "3588", "523", "1761", "2725", "2690", "1064", "2413"]
    got = sample.interactions[sample.interactions["user_id"] == user]
    assert got["item_id"].tolist() == expected
    # consecutive rows of the global order, since the user's samples are contiguous
    assert got["timestamp"].diff().dropna().eq(1).all()
    # later samples' histories are consistent with the rebuilt sequence
    for n, history in enumerate(mine["history_item_id"]):
        h = [str(i) for i in ast.literal_eval(history)]
        assert expected[: len(h)] == h
        assert expected[len(h)] == mine["item_id"].iloc[n]


def test_sequence_with_repeated_history_items_keeps_repeats(sample):
    user = "A5382"  # history [3437, 642, 642, 2520] then targets 1128, 2540
    got = sample.interactions[sample.interactions["user_id"] == user]["item_id"].tolist()
    assert got == ["3437", "642", "642", "2520", "1128", "2540"]


def test_valid_rows_come_before_test_rows(sample):
    inter = sample.interactions
    valid_users = set(pd.read_csv(VALID_CSV, dtype=str)["user_id"])
    first_test_user = pd.read_csv(TEST_CSV, dtype=str)["user_id"].iloc[0]
    assert first_test_user == "A6948"
    is_valid = inter["user_id"].isin(valid_users)
    # all valid-split users' rows form the prefix
    n_valid = int(is_valid.sum())
    assert is_valid.iloc[:n_valid].all() and not is_valid.iloc[n_valid:].any()
    assert inter["user_id"].iloc[n_valid] == first_test_user
    assert inter["user_id"].iloc[0] == "A4042"
    assert inter["item_id"].iloc[:2].tolist() == ["3112", "114"]


def test_timestamps_are_synthetic_and_strictly_increasing(sample):
    ts = sample.interactions["timestamp"]
    assert str(ts.dtype) == "Int64"
    assert SYNTHETIC_EPOCH == 946_684_800  # 2000-01-01T00:00:00Z
    assert ts.tolist() == list(range(946_684_800, 946_684_800 + len(ts)))
    assert ts.is_monotonic_increasing and ts.is_unique


def test_notes_and_files(sample):
    assert sample.notes == {
        "train_files": 0,
        "valid_files": 1,
        "test_files": 1,
        "duplicate_item_rows_dropped": 0,
    }
    assert sample.files["interactions"] == [VALID_CSV, TEST_CSV]


def test_train_split_is_read_first_and_carries_the_history(tmp_path):
    folder = copy_sample(tmp_path)
    (folder / "train").mkdir()
    # A5901's first valid sample had history [79, 3588]: a train file supplying it
    (folder / "train" / f"{STEM}.csv").write_text(
        "user_id,history_item_id,item_id\nA5901,[79],3588\n"
    )
    tables = read_minionerec(folder)
    inter = tables.interactions
    assert tables.notes["train_files"] == 1
    assert inter["user_id"].iloc[:2].tolist() == ["A5901", "A5901"]
    assert inter["item_id"].iloc[:2].tolist() == ["79", "3588"]
    got = inter[inter["user_id"] == "A5901"]["item_id"].tolist()
    # the valid samples' histories are not re-added once the user has been seen
    assert got == ["79", "3588", "523", "1761", "2725", "2690", "1064", "2413"]
    assert len(inter) == 321 - 2 + 2


# ---------------------------------------------------------------------------- errors


def test_missing_folder(tmp_path):
    path = tmp_path / "does-not-exist"
    with pytest.raises(InputError, match="MiniOneRec data folder does not exist") as err:
        read_minionerec(path)
    assert str(path) in str(err.value)


def test_a_file_instead_of_a_folder():
    with pytest.raises(InputError, match="ingest.path names a file; .* give the folder"):
        read_minionerec(VALID_CSV)


def test_folder_without_csvs(tmp_path):
    folder = copy_sample(tmp_path)
    shutil.rmtree(folder / "valid")
    shutil.rmtree(folder / "test")
    with pytest.raises(InputError, match="no train/valid/test CSV found") as err:
        read_minionerec(folder)
    assert str(folder) in str(err.value)


def test_folder_without_catalog(tmp_path):
    folder = copy_sample(tmp_path)
    shutil.rmtree(folder / "index")
    shutil.rmtree(folder / "info")
    with pytest.raises(InputError, match="no item catalog found"):
        read_minionerec(folder)


def test_history_that_is_not_a_list_literal(tmp_path):
    folder = copy_sample(tmp_path)
    csv = folder / "test" / f"{STEM}.csv"
    csv.write_text("user_id,history_item_id,item_id\nA1,[3112],114\nA2,[3112; 114,278\n")
    with pytest.raises(InputError) as err:
        read_minionerec(folder)
    text = str(err.value)
    assert str(csv) in text
    assert "column 'history_item_id'" in text
    assert "history is not a Python list literal" in text
    assert "(rows 1)" in text and "'[3112; 114'" in text


def test_history_that_is_a_literal_but_not_a_list(tmp_path):
    folder = copy_sample(tmp_path)
    csv = folder / "valid" / f"{STEM}.csv"
    csv.write_text("user_id,history_item_id,item_id\nA1,{'a': 1},114\n")
    with pytest.raises(InputError, match="history is not a list"):
        read_minionerec(folder)


def test_split_csv_without_required_columns(tmp_path):
    folder = copy_sample(tmp_path)
    csv = folder / "valid" / f"{STEM}.csv"
    csv.write_text("user_id,history,item\nA1,[1],2\n")
    with pytest.raises(
        InputError, match=r"lacks required column\(s\) \['history_item_id', 'item_id'\]"
    ):
        read_minionerec(folder)


def test_item_json_that_is_not_json(tmp_path):
    folder = copy_sample(tmp_path)
    item_json = folder / "index" / ITEM_JSON.name
    item_json.write_text('{"3": {"title": "cut')
    with pytest.raises(InputError, match="item file is not valid JSON") as err:
        read_minionerec(folder)
    assert str(item_json) in str(err.value)


def test_info_line_with_wrong_field_count(tmp_path):
    folder = copy_sample(tmp_path)
    (folder / "index" / ITEM_JSON.name).unlink()
    info = folder / "info" / INFO_TXT.name
    info.write_text("<a_1><b_2><c_3>\tTitle\t3\n<a_1><b_2><c_4> Title 4\n")
    with pytest.raises(InputError, match="line 2 has 1 tab-separated fields"):
        read_minionerec(folder)


# ---------------------------------------------------------------------------- known gaps


def test_every_later_sample_continues_its_user_in_the_real_files(sample):
    """The check below holds for MiniOneRec's own files: each user's later histories are the
    end of the items rebuilt before them (a window over the newest ones)."""
    rows = split_rows()
    for user, group in rows.groupby("user_id", sort=False):
        sequence = list(ast.literal_eval(group["history_item_id"].iloc[0]))
        for history, target in zip(group["history_item_id"], group["item_id"], strict=True):
            history = list(ast.literal_eval(history))
            assert sequence[-len(history) :] == history, user
            sequence.append(int(target))


def test_rows_out_of_time_order_are_refused_with_file_rows_and_user(tmp_path):
    folder = copy_sample(tmp_path)
    csv = folder / "valid" / f"{STEM}.csv"
    csv.write_text(
        "user_id,history_item_id,item_id\n"
        'A1,"[1, 2]",3\n'
        "A2,[7],8\n"
        'A1,"[2, 3]",4\n'  # in order: [1, 2, 3] ends with [2, 3]
        'A1,"[3, 5]",6\n'  # out of order: 5 is not A1's item before 6
    )
    with pytest.raises(InputError) as err:
        read_minionerec(folder)
    text = str(err.value)
    assert str(csv) in text and "column 'history_item_id'" in text
    assert "1 samples do not continue their user's earlier samples" in text
    assert "(rows 3)" in text and "user A1: ['3', '5'] after ['2', '3', '4']" in text


def test_a_history_window_cut_to_the_newest_items_is_in_order(tmp_path):
    folder = copy_sample(tmp_path)
    (folder / "valid" / f"{STEM}.csv").write_text(
        'user_id,history_item_id,item_id\nA1,"[1, 2, 3]",4\nA1,"[3, 4]",5\nA1,[],6\n'
    )
    shutil.rmtree(folder / "test")
    inter = read_minionerec(folder).interactions
    assert inter[inter["user_id"] == "A1"]["item_id"].tolist() == ["1", "2", "3", "4", "5", "6"]


def test_empty_target_item_is_missing_not_nan(tmp_path):
    folder = copy_sample(tmp_path)
    (folder / "test" / f"{STEM}.csv").write_text(
        'user_id,history_item_id,item_id\nA1,[3112],\nA1,"[3112, 114]",278\n'
    )
    inter = read_minionerec(folder).interactions
    assert "nan" not in set(inter["item_id"].dropna())
    # the blank is a null item for validation to report, not a break in the order
    assert inter[inter["user_id"] == "A1"]["item_id"].tolist() == ["3112", pd.NA, "278"]


def test_split_folder_wins_over_words_in_the_file_name(tmp_path):
    folder = copy_sample(tmp_path)
    (folder / "valid" / f"{STEM}.csv").rename(folder / "valid" / "Restraints_5.csv")
    assert read_minionerec(folder).notes["valid_files"] == 1


def test_non_utf8_info_file_is_an_input_error(tmp_path):
    folder = copy_sample(tmp_path)
    (folder / "index" / ITEM_JSON.name).unlink()
    (folder / "info" / INFO_TXT.name).write_bytes(b"<a_1>\t\xff\xfe title\t3\n")
    with pytest.raises(InputError):
        read_minionerec(folder)


# ---------------------------------------------------------------------------- the ingest stage


def test_ingest_stage_writes_raw_tables(project, make_settings):
    settings = make_settings(
        project,
        project={"dataset": "mini"},
        ingest={"source": "minionerec", "path": str(MINIONEREC_SAMPLE)},
    )
    result = ingest(settings)
    raw = project / "data" / "raw" / "mini"
    inter_path, items_path = raw / "interactions.parquet", raw / "items.parquet"
    assert inter_path.is_file() and items_path.is_file()
    inter = pq.read_table(inter_path).to_pandas()
    items = pq.read_table(items_path).to_pandas()
    assert len(inter) == 321
    assert len(items) == 283
    assert inter.columns.tolist() == ["user_id", "item_id", "timestamp"]
    assert inter["user_id"].nunique() == 51
    assert inter["timestamp"].min() == SYNTHETIC_EPOCH
    assert set(inter["item_id"]) <= set(items["item_id"])
    metrics = json.loads((project / "metrics" / "ingest.json").read_text())
    assert metrics["source"] == "minionerec"
    assert (metrics["users"], metrics["items"], metrics["interactions"]) == (51, 283, 321)
    assert result.metrics["interactions"] == 321


def test_a_folder_of_several_categories_needs_ingest_category(tmp_path):
    # MiniOneRec's data/Amazon holds every category side by side, each with item ids 0, 1, ...
    folder = copy_sample(tmp_path)
    for path in sorted(folder.rglob("Industrial_and_Scientific*")):
        other = path.with_name(path.name.replace("Industrial_and_Scientific", "Office_Products"))
        shutil.copy(path, other)
    with pytest.raises(InputError) as err:
        read_minionerec(folder)
    assert "2 MiniOneRec categories (Industrial_and_Scientific, Office_Products)" in str(err.value)
    assert "ingest.category" in str(err.value)
    chosen = read_minionerec(folder, "Industrial_and_Scientific")
    assert chosen.interactions.equals(read_minionerec(MINIONEREC_SAMPLE).interactions)
    assert all("Office" not in str(p) for files in chosen.files.values() for p in files)
    with pytest.raises(InputError, match="ingest.category 'Toys' has no files here"):
        read_minionerec(folder, "Toys")
