"""The issue's must-show: `sidrec pipeline --until validate --source csv ...` accepts a valid
dataset and rejects each kind of bad input with exit code != 0, a message naming the
file/column, no traceback, and nothing new under data/validated or data/processed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sidrec.cli import _errors, app

runner = CliRunner()
HEADER = "user_id,item_id,timestamp\n"
GOOD_ITEMS = "item_id,title\na,Alpha\nb,Beta\nc,Gamma\nd,Delta\n"

BAD_INPUTS = {
    "missing column": (
        HEADER.replace(",timestamp", "") + "1,a\n",
        None,
        ["interactions.csv", "timestamp"],
    ),
    "null user ids": (
        HEADER + "1,a,1600000000\n,b,1600000001\n1,c,1600000002\n",
        None,
        ["interactions.csv", "'user_id'", "rows [1]"],
    ),
    "unknown items": (
        HEADER + "1,a,1600000000\n1,zz,1600000001\n1,c,1600000002\n",
        None,
        ["interactions.csv", "'item_id'", "zz"],
    ),
    "duplicate item ids": (
        None,
        "item_id,title\na,Alpha\na,Not alpha\nb,B\nc,C\nd,D\n",
        ["items.csv", "'item_id'", "unique"],
    ),
    "unparseable timestamps": (
        HEADER + "1,a,1600000000\n1,b,next tuesday\n",
        None,
        ["interactions.csv", "'timestamp'", "next tuesday"],
    ),
    "far-future timestamps": (
        HEADER + "1,a,1600000000\n1,b,1600000001\n1,c,9999999999\n",
        None,
        ["interactions.csv", "'timestamp'", "9999999999"],
    ),
    "all titles empty": (None, "item_id,title\na,\nb, \nc,\nd,\n", ["items.csv", "'title'"]),
    "header only": (HEADER, None, ["interactions.csv", "row_count", "observed 0"]),
    "binary garbage": (b"\x00\x01\x02\xff" * 64, None, ["interactions.csv", "binary"]),
    "single interaction per user": (
        HEADER + "1,a,1600000000\n2,b,1600000001\n3,c,1600000002\n",
        None,
        ["min_user_interactions", "user_id"],
    ),
}


def _invoke(project: Path, inter: Path, items: Path, until: str = "validate"):
    args = [
        "pipeline",
        "--until",
        until,
        "--source",
        "csv",
        "--interactions",
        str(inter),
        "--items",
        str(items),
    ]
    args += ["--dataset", "tiny", "--set", "validate.min_user_interactions=3"]
    return runner.invoke(app, args)


@pytest.fixture
def write_input(project, write_csv_dataset):
    """``write_input(interactions, items)``: the CSV files under ``project/src`` (bytes are
    written as the interactions file as they are)."""

    def write(interactions, items) -> tuple[Path, Path]:
        inter, items_path = write_csv_dataset(
            project / "src",
            None if isinstance(interactions, bytes) else interactions,
            items or GOOD_ITEMS,
        )
        if isinstance(interactions, bytes):
            inter.write_bytes(interactions)
        return inter, items_path

    return write


def test_valid_csv_dataset_is_accepted(project, prefect_harness, write_csv_dataset):
    inter, items = write_csv_dataset(project / "src")
    result = _invoke(project, inter, items, until="split")
    assert result.exit_code == 0, result.output
    assert "sidrec summary" in result.output
    assert (project / "data" / "processed" / "tiny" / "test.parquet").exists()
    assert list((project / "runs").glob("*-retrain/params.yaml"))


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_rejected_cleanly(project, prefect_harness, write_input, case):
    interactions, items, expected = BAD_INPUTS[case]
    inter, items_path = write_input(interactions, items)
    result = _invoke(project, inter, items_path)
    assert result.exit_code == 1, result.output
    assert "error:" in result.output and "Traceback" not in result.output
    for text in expected:
        assert text in result.output, f"{case}: {text!r} not in {result.output!r}"
    assert not (project / "data" / "validated").exists()
    assert not (project / "data" / "processed").exists()


def test_nonexistent_path(project, prefect_harness, write_csv_dataset):
    _, items = write_csv_dataset(project / "src")
    result = _invoke(project, project / "nope.csv", items)
    assert result.exit_code == 1
    assert "nope.csv" in result.output and "does not exist" in result.output
    assert not (project / "data").exists()


def test_bad_config_is_reported_before_anything_runs(project):
    result = runner.invoke(app, ["pipeline", "--set", "split.method=random"])
    assert result.exit_code == 1
    assert "split.method" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["split", "--set", "ingest.typo=1"])
    assert result.exit_code == 1 and "ingest.typo: unknown key" in result.output
    result = runner.invoke(app, ["pipeline", "--until", "train"])
    assert result.exit_code == 1 and "--until must be one of" in result.output
    for key, value in (("sft.objective", "bogus"), ("sids.embedding", "bogus")):
        result = runner.invoke(app, ["pipeline", "--set", f"{key}={value}"])
        assert result.exit_code == 1 and key in result.output, result.output
        assert "Traceback" not in result.output
    assert not (project / "data").exists()


def test_paths_that_cannot_hold_outputs_are_named_with_exit_code_1(project, write_csv_dataset):
    inter, items = write_csv_dataset(project / "src")
    flags = ["--source", "csv", "--interactions", str(inter), "--items", str(items)]
    blocker = project / "a-file"
    blocker.write_text("")
    result = runner.invoke(app, ["ingest", *flags, "--set", f"project.data_dir={blocker}/data"])
    assert result.exit_code == 1, result.output
    assert f"{blocker}/data" in result.output and "Not a directory" in result.output
    result = runner.invoke(app, ["ingest", *flags, "--set", f"project.metrics_dir={blocker}"])
    assert result.exit_code == 1 and "project.metrics_dir: a file, not a folder" in result.output
    assert "Traceback" not in result.output and not (project / "data").exists()


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NotADirectoryError(20, "Not a directory", "data/x"), 1),  # a path: bad input
        (OSError(28, "No space left on device"), 2),  # no path: unexpected, as before
    ],
)
def test_os_errors_with_a_path_are_bad_input(error, code):
    with pytest.raises(typer.Exit) as ended, _errors(debug=False):
        raise error
    assert ended.value.exit_code == code


def test_stage_commands_and_help(project, write_csv_dataset):
    inter, items = write_csv_dataset(project / "src")
    flags = [
        "--source",
        "csv",
        "--interactions",
        str(inter),
        "--items",
        str(items),
        "--dataset",
        "t",
        "-s",
        "validate.min_user_interactions=3",
        "-s",
        "sasrec.max_epochs=2",
    ]
    for stage in ("ingest", "validate", "split", "baselines"):
        result = runner.invoke(app, [stage, *flags])
        assert result.exit_code == 0, result.output
    assert (project / "data" / "processed" / "t" / "train.parquet").exists()
    assert (project / "artifacts" / "baselines" / "t" / "sasrec" / "model.pt").exists()
    assert "SASRec max_len 20" in result.output  # the closing summary of `sidrec baselines`
    assert len(list((project / "runs").glob("*/params.yaml"))) == 4
    help_text = runner.invoke(app, ["--help"]).output
    assert all(cmd in help_text for cmd in ("ingest", "validate", "split", "baselines", "pipeline"))


def test_real_process_prints_no_traceback(project, prefect_harness, write_input):
    """Outside CliRunner, Prefect's own log handlers are live: they must not print a traceback."""
    from prefect.settings import PREFECT_API_URL

    inter, items = write_input(HEADER + "1,a,1600000000\n,b,1600000001\n1,c,1600000002\n", None)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    cmd = [sys.executable, "-m", "sidrec", "pipeline", "--until", "validate", "--source", "csv"]
    cmd += [
        "--interactions",
        str(inter),
        "--items",
        str(items),
        "--dataset",
        "tiny",
        "-s",
        "validate.min_user_interactions=3",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "column 'user_id'" in proc.stderr


def test_pipeline_gives_the_local_prefect_server_time_to_start(monkeypatch):
    from sidrec.cli import _quiet_expected_errors

    key = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    monkeypatch.delenv(key, raising=False)
    _quiet_expected_errors(debug=True)
    assert os.environ[key] == "120"  # Prefect's 20 s default failed a fresh-clone `make run`
    monkeypatch.setenv(key, "45")
    _quiet_expected_errors(debug=True)
    assert os.environ[key] == "45"  # a user's own value wins
