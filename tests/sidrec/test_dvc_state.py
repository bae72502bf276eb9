"""sidrec/dvc_state.py without running a pipeline (tests/test_dvc.py runs one through Prefect
and checks `dvc status` after it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sidrec import dvc_state
from sidrec.dvc_state import record_in_dvc

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dvc_project(tmp_path):
    """A folder holding the repo's dvc.yaml and params.yaml and a .dvc/ folder."""
    for name in ("dvc.yaml", "params.yaml"):
        (tmp_path / name).write_text((REPO / name).read_text())
    (tmp_path / ".dvc").mkdir()
    return tmp_path


@pytest.fixture
def commits(monkeypatch):
    """The `dvc commit` commands record_in_dvc runs (none is executed)."""
    calls: list[list[str]] = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(dvc_state.subprocess, "run", fake_run)
    return calls


def test_a_run_from_params_yaml_commits_the_stages_it_ran_in_dvc_order(dvc_project, commits):
    message = record_in_dvc(
        ["sft", "ingest", "not-a-dvc-stage"],
        config_path=dvc_project / "params.yaml",
        overrides=[],
        root=dvc_project,
    )
    assert message == "dvc: recorded ingest, sft in dvc.lock and the DVC cache"
    (command,) = commits
    assert command[1:] == ["-m", "dvc", "commit", "--force", "--quiet", "ingest", "sft"]


def test_a_run_with_overrides_leaves_the_lock_untouched_and_names_them(dvc_project, commits):
    message = record_in_dvc(
        ["ingest"],
        config_path=dvc_project / "params.yaml",
        overrides=["sft.warm_start=champion", "sids.incremental=true"],
        root=dvc_project,
    )
    assert message.startswith("dvc: dvc.lock left untouched")
    assert "sft.warm_start=champion, sids.incremental=true" in message
    assert commits == []


def test_another_config_file_or_no_dvc_project_records_nothing(dvc_project, tmp_path, commits):
    other = dvc_project / "other.yaml"
    message = record_in_dvc(["ingest"], config_path=other, overrides=[], root=dvc_project)
    assert "left untouched" in message and "other.yaml" in message
    bare = tmp_path / "bare"
    bare.mkdir()
    message = record_in_dvc(["ingest"], config_path="params.yaml", overrides=[], root=bare)
    assert message.startswith("dvc: not a DVC project here")
    assert commits == []


def test_a_failing_commit_does_not_fail_the_run_and_says_how_to_record(dvc_project, monkeypatch):
    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 255, "", "ERROR: unexpected error\n")

    monkeypatch.setattr(dvc_state.subprocess, "run", failing)
    message = record_in_dvc(
        ["split"], config_path=dvc_project / "params.yaml", overrides=[], root=dvc_project
    )
    assert "recording failed (ERROR: unexpected error)" in message
    assert "`dvc commit --force split`" in message


def test_a_commit_that_times_out_is_reported_not_raised(dvc_project, monkeypatch):
    def slow(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(dvc_state.subprocess, "run", slow)
    message = record_in_dvc(
        ["split"], config_path=dvc_project / "params.yaml", overrides=[], root=dvc_project
    )
    assert "recording failed (TimeoutExpired" in message
