"""A pipeline killed mid-stage: no half-written output, no MLflow run left RUNNING, and the
re-run goes on from the last completed stage (sidrec/tracking.py, Prefect's cache)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import yaml

SFT_FOREVER = ["--set", "sft.epochs=1000", "--set", "sft.patience=null", "--until", "sft"]
"""An SFT stage that is still training when it is killed."""


def _start(work: Path, env: dict[str, str], args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sidrec", "pipeline", *args],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: kill -9 takes the Prefect server too
    )


def _runs(work: Path) -> dict[str, tuple[str, str]]:
    """run id → (run name, status) of the folder's `sidrec-tiny` experiment."""
    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sidrec-tiny")
    if experiment is None:
        return {}
    runs = client.search_runs([experiment.experiment_id])
    return {r.info.run_id: (r.info.run_name, r.info.status) for r in runs}


def _wait_for_sft_run(work: Path, proc: subprocess.Popen[str], known: set[str]) -> str:
    """The id of the new RUNNING sft run, once SFT trains (a validation has run)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        new = {
            run_id
            for run_id, (name, status) in _runs(work).items()
            if name == "sft" and status == "RUNNING" and run_id not in known
        }
        if new:
            time.sleep(3)  # well inside the training loop
            return new.pop()
        time.sleep(1)
    raise AssertionError("the sft stage did not start within 300 s")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_runs_end_killed_write_nothing_and_the_rerun_resumes(
    tmp_path, csv_project, sidrec_subprocess_env, run_sidrec
):
    work, params = csv_project(tmp_path / "proj")
    env = sidrec_subprocess_env(work)
    model = work / "artifacts" / "sft" / "tiny" / "model"

    # kill -9 mid-SFT (the whole process group, as a lost machine would): the runs stay RUNNING
    first = _start(work, env, SFT_FOREVER)
    try:
        killed_sft = _wait_for_sft_run(work, first, set())
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    assert not model.exists()
    orphans = {i for i, (_, status) in _runs(work).items() if status == "RUNNING"}
    assert killed_sft in orphans and len(orphans) == 2  # the pipeline run and its sft run

    # the next run ends them KILLED before it starts; SIGTERM then ends its own runs KILLED
    second = _start(work, env, SFT_FOREVER)
    try:
        second_sft = _wait_for_sft_run(work, second, orphans)
        assert all(_runs(work)[i][1] == "KILLED" for i in orphans)
        second.send_signal(signal.SIGTERM)
        output = second.communicate(timeout=120)[0]
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert second.returncode == 143, output[-3000:]
    assert "terminated" in output
    assert _runs(work)[second_sft][1] == "KILLED"
    assert not [i for i, (_, status) in _runs(work).items() if status == "RUNNING"]
    assert not model.exists()

    # the re-run keeps every stage before sft (Prefect's cache) and finishes sft
    before = {p: p.stat().st_mtime_ns for p in (work / "metrics").glob("*.json")}
    assert {p.stem for p in before} >= {"ingest", "validation", "split", "sids", "baselines"}
    params["sft"]["epochs"] = 1
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run_sidrec(work, ["pipeline", "--until", "sft"])
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # nothing recomputed
    assert (model / "config.json").exists()
    assert not [i for i, (_, status) in _runs(work).items() if status == "RUNNING"]
