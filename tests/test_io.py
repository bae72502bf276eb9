from __future__ import annotations

import stat

import pandas as pd
import pytest

import sidrec.io
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs, atomic_write_json, read_table, replace_dir
from sidrec.schemas import INTERACTIONS


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"user_id": ["u"], "item_id": ["i"], "timestamp": [1]})


def test_atomic_outputs_publish_together(tmp_path):
    a, b = tmp_path / "x" / "a.parquet", tmp_path / "b.json"
    with AtomicOutputs() as out:
        out.parquet(_frame(), a, INTERACTIONS)
        out.json({"k": 1}, b)
        assert not a.exists() and not b.exists()
    assert read_table(a, INTERACTIONS, "t").to_dict("records") == [
        {"user_id": "u", "item_id": "i", "timestamp": 1}
    ]
    assert b.read_text().strip().startswith("{")
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_failed_stage_keeps_previous_outputs_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "m.json"
    atomic_write_json(target, {"old": True})
    with pytest.raises(RuntimeError), AtomicOutputs() as out:
        out.json({"new": True}, target)
        raise RuntimeError("boom")
    assert '"old"' in target.read_text()
    assert list(tmp_path.iterdir()) == [target]


def test_a_staged_folder_replaces_the_old_one_whole_or_not_at_all(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "old.bin").write_text("old")

    def write(tmp):
        (tmp / "new.bin").write_text("new")

    with pytest.raises(RuntimeError), AtomicOutputs() as out:
        out.folder(folder, write)
        raise RuntimeError("boom")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in folder.iterdir()] == ["old.bin"]
    with AtomicOutputs() as out:
        out.folder(folder, write)
        assert [p.name for p in folder.iterdir()] == ["old.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in folder.iterdir()] == ["new.bin"]  # nothing of the old folder left


def test_published_outputs_are_readable_by_other_users_as_the_umask_allows(tmp_path, monkeypatch):
    """Staging goes through mkstemp/mkdtemp (owner-only); published outputs get open()'s mode."""
    monkeypatch.setattr(sidrec.io, "UMASK", 0o022)

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    with AtomicOutputs() as out:
        out.parquet(_frame(), tmp_path / "a.parquet", INTERACTIONS)
        out.json({"k": 1}, tmp_path / "b.json")
        out.folder(tmp_path / "model", lambda tmp: (tmp / "w.bin").write_text("w"))
    atomic_write_json(tmp_path / "c.json", {})
    staged = tmp_path / ".best"
    staged.mkdir(mode=0o700)
    replace_dir(staged, tmp_path / "best")
    assert [mode(tmp_path / name) for name in ("a.parquet", "b.json", "c.json")] == [0o644] * 3
    assert mode(tmp_path / "model") == mode(tmp_path / "best") == 0o755

    monkeypatch.setattr(sidrec.io, "UMASK", 0o077)  # a user who wants owner-only files gets them
    atomic_write_json(tmp_path / "d.json", {})
    assert mode(tmp_path / "d.json") == 0o600


def test_read_table_checks_schema(tmp_path):
    path = tmp_path / "t.parquet"
    _frame().drop(columns="timestamp").to_parquet(path)
    with pytest.raises(InputError, match="no column 'timestamp'"):
        read_table(path, INTERACTIONS, "interactions")
    pd.DataFrame({"user_id": ["u"], "item_id": ["i"], "timestamp": ["x"]}).to_parquet(path)
    with pytest.raises(InputError, match="expected int64"):
        read_table(path, INTERACTIONS, "interactions")
    with pytest.raises(InputError, match="not found"):
        read_table(tmp_path / "nope.parquet", INTERACTIONS, "interactions")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="not a readable Parquet"):
        read_table(tmp_path / "junk.parquet", INTERACTIONS, "interactions")
