"""The amazon-beauty source: the P5/TIGER Beauty 5-core folder (``ingest.amazon_beauty_dir``),
read in its order once its hashes match; a missing folder or a changed file is a clear error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sidrec.cli import app
from sidrec.config import IngestConfig
from sidrec.errors import InputError
from sidrec.sources import source_files
from sidrec.sources.amazon_beauty import SHA256, read_amazon_beauty

SHARED = IngestConfig().amazon_beauty_folder()  # the default: ../shared from the checkout
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"the shared Amazon Beauty folder is absent ({SHARED.resolve()})"
)


@needs_shared
def test_beauty_counts_order_and_text():
    tables = read_amazon_beauty(SHARED)
    inter, items = tables.interactions, tables.items
    assert (inter["user_id"].nunique(), len(items), len(inter)) == (22_363, 12_101, 198_502)
    assert inter["item_id"].nunique() == 12_101
    assert list(items.columns) == ["item_id", "title", "categories"]
    assert items["title"].str.len().min() > 0
    # each user's items in the file's order, one (synthesized) day apart
    gaps = inter.groupby("user_id", sort=False)["timestamp"].diff().dropna()
    assert (gaps == 86_400).all()


def test_source_files_are_the_folders_two_files(tmp_path):
    cfg = IngestConfig(source="amazon-beauty", amazon_beauty_dir=tmp_path)
    assert source_files(cfg) == [tmp_path / "interactions.csv", tmp_path / "items.csv"]


def test_a_relative_folder_starts_at_the_project_root(project):
    repo = Path(__file__).resolve().parents[3]
    assert IngestConfig().amazon_beauty_folder() == repo / "../shared/datasets/amazon-beauty"
    assert IngestConfig(amazon_beauty_dir=Path("b")).amazon_beauty_folder() == repo / "b"


def test_a_missing_folder_names_the_setting_and_the_csv_alternative(tmp_path):
    with pytest.raises(InputError) as err:
        read_amazon_beauty(tmp_path / "nowhere")
    for text in (str(tmp_path / "nowhere"), "ingest.amazon_beauty_dir", "--source csv"):
        assert text in str(err.value)


def test_changed_or_missing_files_are_refused(tmp_path):
    folder = tmp_path / "beauty"
    folder.mkdir()
    (folder / "interactions.csv").write_text("user_id,item_id,timestamp\n1,a,946684800\n")
    with pytest.raises(InputError) as err:
        read_amazon_beauty(folder)
    assert str(folder / "interactions.csv") in str(err.value)
    assert f"expected {SHA256['interactions.csv']}" in str(err.value)
    assert "--source csv" in str(err.value)

    if SHARED.is_dir():  # the right interactions, no items: the items file is named
        shutil.copy(SHARED / "interactions.csv", folder / "interactions.csv")
        with pytest.raises(InputError, match=r"items.csv: missing; expected the file of"):
            read_amazon_beauty(folder)


def test_the_cli_exits_1_and_writes_nothing_without_the_folder(project, tmp_path):
    missing = tmp_path / "no-beauty"
    result = CliRunner().invoke(
        app, ["ingest", "--source", "amazon-beauty", "--set", f"ingest.amazon_beauty_dir={missing}"]
    )
    assert result.exit_code == 1, result.output
    assert "error:" in result.output and "Traceback" not in result.output
    assert str(missing) in result.output and "ingest.amazon_beauty_dir" in result.output
    assert not (project / "data").exists() and not (project / "metrics").exists()
