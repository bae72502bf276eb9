"""Prefect flows: persisted results and cache keys skip unchanged stages."""

from __future__ import annotations

import pytest

from flows.data import prepare_data


def test_rerun_skips_unchanged_stages_and_repairs_deleted_outputs(
    project, prefect_harness, files_under, csv_settings, write_csv_dataset
):
    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="flowtest")
    first = prepare_data(settings)
    assert {k: first["split"].metrics[k]["rows"] for k in ("train", "valid", "test")} == {
        "train": 3,
        "valid": 3,
        "test": 3,
    }
    before = files_under("data")

    again = prepare_data(settings)
    assert files_under("data") == before  # every task was served from the cache
    assert again["split"].outputs == first["split"].outputs

    settings.paths.split("test").unlink()
    prepare_data(settings)
    after = files_under("data")
    assert settings.paths.split("test").exists()
    changed = {p for p in after if after[p] != before.get(p)}
    assert changed == {str(settings.paths.split(n)) for n in ("train", "valid", "test")}


def test_changing_a_split_param_reruns_only_split(
    project, prefect_harness, files_under, csv_settings, write_csv_dataset
):
    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="flowparam")
    prepare_data(settings)
    before = files_under("data")
    shorter = csv_settings(project, inter, items, dataset="flowparam", split={"max_history": 1})
    result = prepare_data(shorter)
    after = files_under("data")
    changed = {p for p in after if after[p] != before[p]}
    assert changed == {str(shorter.paths.split(n)) for n in ("train", "valid", "test")}
    assert result["split"].metrics["test"]["mean_history"] == 1.0


def test_changed_source_data_reruns_everything(
    project, prefect_harness, csv_settings, write_csv_dataset
):
    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="flowdata")
    prepare_data(settings)
    inter.write_text(inter.read_text() + "u9,a,1600000900\nu9,b,1600000901\nu9,c,1600000902\n")
    result = prepare_data(settings)
    assert result["ingest"].metrics["users"] == 4
    assert result["split"].metrics["test"]["rows"] == 4
    # the new load's drift report against the first, as a Prefect artifact
    drift = _latest_artifact("drift-report-flowdata")
    assert (
        "`flowdata` against the last load" in drift and "| users | 3 | 4 | +33.3% · 1 new" in drift
    )


def _latest_artifact(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        TaskRunFilter,
    )
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        # every argument explicit: this prefect client sends None for omitted ones, which the server rejects
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            flow_run_filter=FlowRunFilter(),
            task_run_filter=TaskRunFilter(),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
            offset=0,
        )
    assert isinstance(artifact.data, str)
    return artifact.data


def test_failed_validation_publishes_report_artifact_and_writes_nothing_downstream(
    project, prefect_harness, csv_settings, write_csv_dataset
):
    import pytest
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        TaskRunFilter,
    )
    from prefect.client.schemas.sorting import ArtifactSort

    from sidrec.errors import ValidationFailed

    inter, items = write_csv_dataset(
        project / "src", "user_id,item_id,timestamp\n1,a,1600000000\n1,zz,1600000001\n"
    )
    settings = csv_settings(project, inter, items, dataset="flow-bad")
    with pytest.raises(ValidationFailed):
        prepare_data(settings)
    with get_client(sync_client=True) as client:
        # every argument explicit: this prefect client sends None for omitted ones, which the server rejects
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["validation-report-flow-bad"])
            ),
            flow_run_filter=FlowRunFilter(),
            task_run_filter=TaskRunFilter(),
            sort=ArtifactSort.UPDATED_DESC,
            limit=1,
            offset=0,
        )
    assert "FAILED" in artifact.data and "zz" in artifact.data
    assert (
        not (project / "data" / "validated").exists()
        and not (project / "data" / "processed").exists()
    )


def test_build_sids_flow_logs_the_sid_report_to_mlflow(
    project, prefect_harness, make_settings, write_validated_catalog
):
    import mlflow

    from flows.sids import build_sids
    from models.sid import read_sid_map

    settings = make_settings(
        project,
        project={"dataset": "flowsids"},
        sids={"method": "rqkmeans", "levels": 2, "codebook_size": 8},
    )
    ids = write_validated_catalog(settings, 40)
    results = build_sids(settings)
    assert results["embed"].metrics["items"] == 40
    assert sorted(read_sid_map(settings.paths.sid_map)) == sorted(ids)
    runs = mlflow.search_runs(experiment_names=["sidrec-flowsids"], output_format="list")
    (run,) = [r for r in runs if r.data.tags["sidrec.stage"] == "sids"]
    assert run.data.metrics["collision_rate_after"] == 0.0
    assert run.data.metrics["items"] == 40.0 and "level0_usage" in run.data.metrics
    assert run.data.params["method"] == "rqkmeans"
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"sids.json", "code_usage.png"} <= artifacts


def test_train_flow_until_baselines_trains_sasrec_once(
    project, prefect_harness, files_under, csv_settings, write_csv_dataset
):
    import mlflow

    from flows.train import train_recommender

    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="flowbase", sasrec={"max_epochs": 2})
    prepare_data(settings)
    results = train_recommender(settings, until="baselines")
    assert set(results) == {"baselines"} and results["baselines"].metrics["epochs_run"] <= 2
    assert (settings.paths.sasrec_model / "model.pt").exists()
    before = files_under("artifacts")

    train_recommender(settings, until="baselines")
    assert files_under("artifacts") == before  # served from the cache

    patient = csv_settings(
        project, inter, items, dataset="flowbase", sasrec={"max_epochs": 2, "patience": 1}
    )
    train_recommender(patient, until="baselines")
    after = files_under("artifacts")
    sasrec = {str(settings.paths.sasrec_model / name) for name in ("model.pt", "config.json")}
    # the blend's weight is chosen with the new SASRec, so EASE's choice may change too
    changed = {p for p in after if after[p] != before[p]}
    assert sasrec <= changed <= {*sasrec, str(settings.paths.ease_choice)}
    runs = mlflow.search_runs(experiment_names=["sidrec-flowbase"], output_format="list")
    logged = [r for r in runs if r.data.tags["sidrec.stage"] == "baselines"]
    assert len(logged) == 2 and "valid_selection.ndcg_at_10" in logged[0].data.metrics


def test_ingest_retries_io_failures_but_never_bad_input(
    project, prefect_harness, monkeypatch, csv_settings, write_csv_dataset
):
    import pytest
    from prefect import flow

    import tasks.ingest
    from sidrec.errors import InputError

    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="retrytest")
    calls: list[str] = []

    def failing(error: Exception):
        def ingest(_settings):
            calls.append(type(error).__name__)
            raise error

        return ingest

    @flow
    def only_ingest(s):
        return tasks.ingest.ingest_task(s)

    monkeypatch.setattr(tasks.ingest, "ingest", failing(InputError("bad rows")))
    with pytest.raises(InputError, match="bad rows"):
        only_ingest(settings)
    assert calls == ["InputError"]  # bad input: once, no retry

    calls.clear()
    monkeypatch.setattr(tasks.ingest, "ingest", failing(OSError("disk went away")))
    with pytest.raises(OSError, match="disk went away"):
        only_ingest(settings)
    assert calls == ["OSError"] * 3  # the first try and its 2 retries


def test_no_local_api_is_started_beside_a_set_server(monkeypatch):
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.common import start_local_api

    def refuse(self, timeout=None):
        raise AssertionError("a local API was started although PREFECT_API_URL is set")

    monkeypatch.setattr(SubprocessASGIServer, "start", refuse)
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        start_local_api()()


def test_the_local_api_starts_in_the_background_and_its_failure_reaches_the_caller(monkeypatch):
    import threading

    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.common import start_local_api

    started = []

    def start(self, timeout=None):
        started.append((self, threading.current_thread().name))
        raise RuntimeError("no free port")

    monkeypatch.setattr(SubprocessASGIServer, "start", start)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        wait = start_local_api()
        with pytest.raises(RuntimeError, match="no free port"):
            wait()
    ((server, thread),) = started
    assert thread == "prefect-local-api"  # not the caller's thread
    assert server is SubprocessASGIServer()  # the one instance a flow run's client starts
