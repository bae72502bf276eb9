"""One parent MLflow run per pipeline run, a nested run per stage — from any thread, from a
process given the parent's id, and for transformers' MLflow callback (the SFT/GRPO trainers)."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import pytest

from sidrec.config import load_settings
from sidrec.tracking import (
    PARENT_RUN_ENV,
    ServerUnreachable,
    Terminated,
    end_orphaned_runs,
    experiment_name,
    log_stage,
    parent_run_id,
    pipeline_run,
    process_tags,
    raise_on_sigterm,
    require_server,
    stage_run,
    tracking_uri,
    use_parent_run,
)

REPO = Path(__file__).resolve().parents[2]
PARENT_TAG = "mlflow.parentRunId"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # artifacts land here
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)


def _run(run_id: str) -> mlflow.entities.Run:
    return mlflow.MlflowClient(tracking_uri()).get_run(run_id)


def _stage(name: str) -> str:
    return log_stage(dataset="track", stage=name, params={"a": {"b": 1}}, metrics={"m": 0.5})


def test_stages_nest_under_the_pipeline_run_from_any_thread() -> None:
    config = load_settings(REPO / "params.yaml").to_yaml_dict()  # > 100 params: batched
    with pipeline_run(dataset="track", params=config) as parent:
        assert parent_run_id() == parent
        same_thread = _stage("ingest")
        with ThreadPoolExecutor(1) as pool:  # Prefect may run a task in a worker thread
            other_thread = pool.submit(_stage, "split").result()
    assert parent_run_id() is None and PARENT_RUN_ENV not in os.environ
    run = _run(parent)
    assert run.info.status == "FINISHED"
    assert run.data.params["split.max_history"] == str(config["split"]["max_history"])
    for child in (same_thread, other_thread):
        data = _run(child).data
        assert data.tags[PARENT_TAG] == parent
        assert data.params["a.b"] == "1" and data.metrics["m"] == 0.5
    assert mlflow.active_run() is None


def test_failed_pipeline_marks_its_run_failed() -> None:
    with pytest.raises(RuntimeError), pipeline_run(dataset="track", params={}) as parent:
        raise RuntimeError("stage failed")
    assert _run(parent).info.status == "FAILED" and parent_run_id() is None


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, Terminated, SystemExit])
def test_an_interrupted_pipeline_ends_its_runs_killed(interrupt: type[BaseException]) -> None:
    with (
        pytest.raises(interrupt),
        pipeline_run(dataset="track", params={}) as parent,
        stage_run(dataset="track", stage="sft") as stage,
    ):
        raise interrupt()
    assert _run(parent).info.status == "KILLED"
    assert _run(stage.info.run_id).info.status == "KILLED"
    assert mlflow.active_run() is None
    tags = _run(stage.info.run_id).data.tags
    assert tags["sidrec.pid"] == str(os.getpid()) and tags["sidrec.host"] == socket.gethostname()


def _interrupted_mid_read(database: Path) -> None:
    pending = sqlite3.connect(database).execute("SELECT run_uuid FROM runs")  # a row unfetched
    assert pending.description  # the read holds SQLite's shared lock on the database
    raise Terminated("landed between a read and its fetch")


def test_an_interrupt_between_a_read_and_its_fetch_still_ends_the_runs_killed() -> None:
    # the half-read cursor lives on in the traceback's frames; left there, it would make
    # ending the runs wait out MLflow's busy timeout on this process's own lock
    with (
        pytest.raises(Terminated),
        pipeline_run(dataset="track", params={}) as parent,
        stage_run(dataset="track", stage="sft") as stage,
    ):
        _interrupted_mid_read(Path(tracking_uri().removeprefix("sqlite:///")))
    assert _run(parent).info.status == "KILLED"
    assert _run(stage.info.run_id).info.status == "KILLED"


def test_a_run_that_cannot_be_ended_leaves_the_interrupt_as_it_was(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def locked(status: str) -> None:
        raise mlflow.exceptions.MlflowException("database is locked")

    with pytest.raises(Terminated), stage_run(dataset="track", stage="sft") as stage:
        monkeypatch.setattr(mlflow, "end_run", locked)
        raise Terminated("stop")
    assert (
        f"could not end MLflow run {stage.info.run_id} KILLED (database is locked)" in caplog.text
    )


def test_sigterm_raises_terminated_in_the_main_thread() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        raise_on_sigterm()
        with pytest.raises(Terminated, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs before this returns
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_sweep_ends_runs_whose_process_is_gone_and_no_other() -> None:
    mlflow.set_tracking_uri(tracking_uri())
    experiment = mlflow.set_experiment(experiment_name("orphans")).experiment_id
    client = mlflow.MlflowClient(tracking_uri())
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    alive = process_tags()
    cases = {
        "dead pid": alive | {"sidrec.pid": gone.stdout.strip()},
        "pid reused": alive | {"sidrec.pid_started": "1.0"},  # this pid, another process
        "this process": alive,
        "other host": alive | {"sidrec.host": "elsewhere", "sidrec.pid": gone.stdout.strip()},
        "no process tags": {},
    }
    ids = {
        name: client.create_run(experiment, tags=tags).info.run_id for name, tags in cases.items()
    }
    assert set(end_orphaned_runs("orphans")) == {ids["dead pid"], ids["pid reused"]}
    status = {name: _run(run_id).info.status for name, run_id in ids.items()}
    assert status == {
        "dead pid": "KILLED",
        "pid reused": "KILLED",
        "this process": "RUNNING",
        "other host": "RUNNING",
        "no process tags": "RUNNING",
    }
    assert end_orphaned_runs("orphans") == []


def test_stage_outside_a_pipeline_is_a_top_level_run() -> None:
    assert PARENT_TAG not in _run(_stage("embed")).data.tags


def test_child_process_nests_under_a_given_parent() -> None:
    with pipeline_run(dataset="track", params={}) as parent:
        pass  # e.g. the parent flow hands `parent` to a child deployment as a parameter
    with use_parent_run(parent):
        child = _stage("sft")
    assert _run(child).data.tags[PARENT_TAG] == parent and parent_run_id() is None


def test_trainer_callback_logs_into_the_stage_run(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import MLflowCallback

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], run_name="sft")
    state, control = TrainerState(), TrainerControl()
    with (
        pipeline_run(dataset="track", params={}) as parent,
        stage_run(dataset="track", stage="sft", params={"sft": {"epochs": 3}}) as run,
    ):
        callback = MLflowCallback()
        callback.on_train_begin(args, state, control)
        callback.on_log(args, state, control, logs={"loss": 1.25})
        callback.on_train_end(args, state, control)
        assert mlflow.active_run().info.run_id == run.info.run_id  # left open for the stage
    data = _run(run.info.run_id).data
    assert data.tags[PARENT_TAG] == parent
    assert data.metrics["loss"] == 1.25 and data.params["sft.epochs"] == "3"
    assert data.params["learning_rate"] == str(args.learning_rate)  # the trainer's own params
    assert _run(run.info.run_id).info.status == "FINISHED"


def test_an_unreachable_tracking_server_is_named_at_once(
    monkeypatch: pytest.MonkeyPatch, free_port
) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with (
        pytest.raises(ServerUnreachable, match=f"cannot reach the MLflow tracking server {uri}"),
        stage_run(dataset="track", stage="sft"),
    ):
        pytest.fail("the stage ran without its server")


def test_a_server_that_answers_passes_and_file_stores_are_never_asked() -> None:
    import http.server
    import threading

    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # any answer counts, a 404 from a proxy included
            paths.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}/mlflow/"
        require_server(uri)
        require_server(uri)
    finally:
        server.shutdown()
        server.server_close()
    assert paths == ["/mlflow/health"] * 2  # asked at every connection: it may go away
    require_server("sqlite:///nowhere/mlflow.db")  # no network, nothing to check
    require_server("file:///nowhere/mlruns")


def test_the_cli_names_an_unreachable_tracking_server_and_exits_1(
    project: Path, sidrec_subprocess_env, free_port
) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    env = {**sidrec_subprocess_env(project), "MLFLOW_TRACKING_URI": uri}
    env.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)  # MLflow's own retries: about 4 minutes
    proc = subprocess.run(
        [sys.executable, "-m", "sidrec", "recommend", "--history", "1,2"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, output
    assert f"cannot reach the MLflow tracking server {uri}" in output
    assert "Traceback" not in output


def test_a_server_lost_mid_run_is_an_environment_error() -> None:
    import requests
    from mlflow.exceptions import MlflowException

    from sidrec.cli import _environment_error

    def lost() -> None:
        try:
            raise requests.ConnectionError("Max retries exceeded (Connection refused)")
        except requests.ConnectionError as exc:
            raise MlflowException(f"API request failed with exception {exc}") from None

    with pytest.raises(MlflowException) as raised:
        lost()
    message = _environment_error(raised.value)
    assert message is not None and "stopped answering" in message
    assert tracking_uri() in message
    assert _environment_error(MlflowException("RESOURCE_DOES_NOT_EXIST: no such run")) is None
    assert _environment_error(requests.ConnectionError("not MLflow's")) is None
