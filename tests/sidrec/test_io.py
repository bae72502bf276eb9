from __future__ import annotations

import os
import stat

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sidrec.io
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs, atomic_write_json, read_table, replace_dir, to_pandas
from sidrec.schemas import HISTORY, INTERACTIONS, SPLIT


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


def _folder(path, content):
    path.mkdir()
    (path / "w.bin").write_text(content)
    return path


@pytest.fixture
def exchanges(tmp_path):
    """Skip where this filesystem (or libc) cannot swap two folders in one step."""
    a, b = _folder(tmp_path / "probe-a", "a"), _folder(tmp_path / "probe-b", "b")
    if not sidrec.io._exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    assert (a / "w.bin").read_text() == "b"
    for p in (a, b):
        (p / "w.bin").unlink()
        p.rmdir()


def test_a_process_killed_inside_replace_dir_leaves_the_target_whole(
    tmp_path, exchanges, monkeypatch
):
    """The first filesystem step already publishes the new folder: a kill right after it (here
    an interrupt in the clean-up that follows) leaves the new target, never a missing one."""
    target = _folder(tmp_path / "model", "old")
    staged = _folder(tmp_path / ".model.staged", "new")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sidrec.io.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        replace_dir(staged, target)
    assert (target / "w.bin").read_text() == "new"
    assert (staged / "w.bin").read_text() == "old"  # the old folder, for the clean-up to delete


def test_a_reader_never_finds_a_replaced_folder_missing(tmp_path, exchanges):
    import threading

    target = _folder(tmp_path / "model", "0")
    seen, missing, done = set(), [], threading.Event()

    def read():
        while not done.is_set():
            try:
                seen.add((target / "w.bin").read_text())
            except FileNotFoundError as exc:
                missing.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(1, 201):
            replace_dir(_folder(tmp_path / f".model.{i}", str(i)), target)
    finally:
        done.set()
        reader.join()
    assert missing == []
    assert (target / "w.bin").read_text() == "200" and len(seen) > 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_replace_dir_publishes_a_folder_where_there_was_none(tmp_path):
    replace_dir(_folder(tmp_path / ".staged", "new"), tmp_path / "model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (tmp_path / "model" / "w.bin").read_text() == "new"
    with pytest.raises(FileNotFoundError):
        replace_dir(tmp_path / ".gone", tmp_path / "model")
    assert (tmp_path / "model" / "w.bin").read_text() == "new"


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


HISTORIES = [["a", "b"], [], ["b", "c", "a"]]


def _split_table(history_type: pa.DataType) -> pa.Table:
    return pa.table(
        {
            "user_id": ["u", "v", "w"],
            "history": pa.array(HISTORIES, type=history_type),
            "target": ["c", "a", "b"],
            "timestamp": pa.array([1, 2, 3], type=pa.int64()),
        }
    )


def _assert_item_id_strings(histories: pd.Series) -> None:
    """As readers of the split get a history: a numpy array of item-id strings per row."""
    assert [h.tolist() for h in histories] == HISTORIES
    assert all(isinstance(h, np.ndarray) for h in histories)
    assert all(type(i) is str for h in histories for i in h)


def test_split_histories_are_written_as_coded_ids_and_read_as_strings(tmp_path):
    path = tmp_path / "train.parquet"
    frame = _split_table(pa.list_(pa.string())).to_pandas()  # histories as Python sequences
    with AtomicOutputs() as out:
        out.parquet(frame, path, SPLIT)
    assert pq.read_schema(path).field("history").type.equals(HISTORY)  # dictionary pages
    read = read_table(path, SPLIT, "train split")
    _assert_item_id_strings(read["history"])
    assert not read["history"][0].flags.writeable  # views of one array: a reader copies first
    assert read.drop(columns="history").equals(frame.drop(columns="history"))


@pytest.mark.parametrize(
    "history_type", [pa.list_(pa.string()), pa.large_list(pa.large_string()), HISTORY]
)
def test_a_split_written_in_an_earlier_layout_reads_the_same(tmp_path, history_type):
    path = tmp_path / "train.parquet"
    pq.write_table(_split_table(history_type), path)  # list<string>: splits written before
    _assert_item_id_strings(read_table(path, SPLIT, "train split")["history"])


def test_a_split_history_of_another_type_is_refused_with_the_column_and_the_fix(tmp_path):
    path = tmp_path / "train.parquet"
    table = _split_table(pa.list_(pa.string()))
    numbers = pa.array([[1, 2], [], [3]], type=pa.list_(pa.int64()))
    pq.write_table(table.set_column(1, "history", numbers), path)
    with pytest.raises(InputError) as refused:
        read_table(path, SPLIT, "train split")
    message = str(refused.value)
    assert "column 'history'" in message and "list<element: int64>" in message
    assert "expected large_list" in message and "re-run the stage that writes it" in message


def test_coded_lists_convert_as_arrow_would_chunk_by_chunk():
    one = pa.array([["x", "y"], ["y"]], type=HISTORY)
    two = pa.array([["z"], None, [], ["q", "z", "q"]], type=HISTORY)  # its own dictionary
    column = pa.chunked_array([one, two.slice(1), two.slice(0, 1)])
    table = pa.table({"n": list(range(len(column))), "history": column})
    got = to_pandas(table)
    want = table.to_pandas()
    assert got.columns.tolist() == ["n", "history"] and got["n"].equals(want["n"])
    expected = [None if h is None else h.tolist() for h in want["history"]]
    assert [None if h is None else h.tolist() for h in got["history"]] == expected
    assert expected == [["x", "y"], ["y"], None, [], ["q", "z", "q"], ["z"]]


# ---------------------------------------------------------------- writers killed mid-write

KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from sidrec.io import AtomicOutputs

target = Path(sys.argv[1])


def half_write(tmp):
    if tmp.is_dir():
        (tmp / "weights.bin").write_bytes(b"half")
    else:
        tmp.write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)  # as a lost machine: no cleanup runs


class Saved:  # a model or tokenizer whose save_pretrained dies half-way
    def save_pretrained(self, path, state_dict=None):
        half_write(Path(path))


if sys.argv[2] == "model":
    from models.lm import save_model_dir

    save_model_dir(Saved(), Saved(), target)
with AtomicOutputs() as out:
    (out.folder if sys.argv[2] == "folder" else out.stage)(target, half_write)
"""


def _kill_mid_write(target, kind):
    """Run a process that stages ``target`` (a file or a folder), writes half of it and is
    killed with SIGKILL; returns what it left beside the target."""
    import signal
    import subprocess
    import sys

    before = set(target.parent.iterdir()) if target.parent.exists() else set()
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(target), kind], capture_output=True, check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return sorted(set(target.parent.iterdir()) - before)


@pytest.mark.parametrize("kind", ["file", "folder", "model"])
def test_a_killed_writers_leftover_goes_at_the_next_write_and_the_target_stays_whole(
    tmp_path, kind, caplog
):
    target = tmp_path / "out" / ("sid_map.json" if kind == "file" else "model")
    if kind == "file":
        atomic_write_json(target, {"old": True})
    else:
        with AtomicOutputs() as out:
            out.folder(target, lambda tmp: (tmp / "weights.bin").write_bytes(b"old"))
    (left,) = _kill_mid_write(target, kind)
    assert left.name.startswith(f".{target.name}.") and left.name.endswith(".tmp")
    assert (target.read_text() if kind == "file" else (target / "weights.bin").read_text()) in (
        '{\n  "old": true\n}\n',
        "old",
    )  # the target is the previous whole output

    with caplog.at_level("WARNING", logger="sidrec.io"):
        if kind == "file":
            atomic_write_json(target, {"new": True})
        else:
            with AtomicOutputs() as out:
                out.folder(target, lambda tmp: (tmp / "weights.bin").write_bytes(b"new"))
    assert sorted(target.parent.iterdir()) == [target]
    assert f"removed 1 leftover(s) of killed writers of {target}: {left.name}" in caplog.text


def test_leftovers_of_live_writers_other_hosts_and_other_targets_stay(tmp_path):
    from sidrec import process
    from sidrec.io import remove_leftovers

    target = tmp_path / "items.parquet"
    _, pid, start = process.current()
    tag = sidrec.io._HOST_TAG
    elsewhere = "0" * 8 if tag != "0" * 8 else "1" * 8
    cs = round(start * 100)
    keep = [
        f".items.parquet.{pid}-{cs}-{tag}.abc_12.tmp",  # this process: alive
        f".items.parquet.{pid}-{cs}-{elsewhere}.abc.tmp",  # another host's
        ".items.parquet.x7q2.tmp",  # no writer in the name
        f".items.parquet.bak.{pid}-{cs - 500}-{tag}.abc.tmp",  # another target's
        f".other.parquet.{pid}-{cs - 500}-{tag}.abc.tmp",
    ]
    gone = [
        f".items.parquet.{pid}-{cs - 500}-{tag}.abc.tmp",  # this pid, but started 5 s earlier
        f".items.parquet.999999999-{cs}-{tag}.d_e.tmp",  # no such process
    ]
    for name in keep + gone:
        (tmp_path / name).write_bytes(b"x")
    removed = remove_leftovers(target)
    assert sorted(p.name for p in removed) == sorted(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


def test_dvc_ignores_a_leftover_inside_a_tracked_folder(tmp_path):
    """The repo's .dvcignore: a killed writer's leftover in a folder output (data/sids/<ds>,
    data/validated/<ds>) does not change that output for DVC (status, commit, push)."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    dvc = str(Path(sys.executable).parent / "dvc")
    shutil.copy(repo / ".dvcignore", tmp_path / ".dvcignore")
    folder = tmp_path / "data" / "sids" / "ml"
    atomic_write_json(folder / "sid_map.json", {"i1": [1, 2]})
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}

    def run(*args):
        proc = subprocess.run(
            [dvc, *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    run("init", "--no-scm", "-q")
    run("add", "data/sids/ml")
    (left,) = _kill_mid_write(folder / "sid_map.json", "file")
    assert left.parent == folder
    assert json.loads(run("status", "--json")) == {}
