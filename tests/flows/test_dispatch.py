"""The training dispatch (flows/dispatch.py): inline, or a child run of the train-gpu
deployment whose results come back through Prefect."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sidrec.stage import StageResult
from sidrec.tracking import PARENT_RUN_ENV, parent_run_id

parents: list[str | None] = []
"""The pipeline's MLflow parent run each fake training saw (what its stage runs nest under)."""


def _fake_training(calls: list[tuple[Any, str]]):
    def train_recommender(settings, until="evaluate"):
        calls.append((settings, until))
        parents.append(parent_run_id())
        return {
            "sft": StageResult(stage="sft", outputs={}, metrics={"steps": 3}),
            "evaluate": StageResult(stage="evaluate", outputs={}, metrics={"ks": [10]}),
        }

    return train_recommender


def _no_deployment(**kwargs):
    raise AssertionError(f"run_deployment called with {kwargs}")


def test_training_runs_inline_without_a_gpu_deployment(project, monkeypatch, make_settings):
    import flows.dispatch
    import flows.train

    calls: list[tuple[Any, str]] = []
    monkeypatch.setattr(flows.train, "train_recommender", _fake_training(calls))
    monkeypatch.setattr(flows.dispatch, "run_deployment", _no_deployment)
    settings = make_settings(project)
    assert settings.orchestration.gpu_deployment is None
    results = flows.dispatch.run_training(settings, "params.yaml", None, "sft")
    assert calls == [(settings, "sft")]
    assert results["sft"].metrics == {"steps": 3}


def test_training_runs_as_a_child_deployment_run_and_returns_its_results(
    project, prefect_harness, monkeypatch, make_settings
):
    """run_deployment is replaced by a stand-in that runs train_remote here (as the gpu
    worker would) and hands back the flow run as the API reports it, so the results come
    back through Prefect's persisted-result storage as they do from a real worker."""
    import inspect

    from prefect.client.orchestration import get_client

    import flows.dispatch
    import flows.train

    calls: list[tuple[Any, str]] = []
    monkeypatch.setattr(flows.train, "train_recommender", _fake_training(calls))
    requested: dict[str, Any] = {}

    def run_deployment(**kwargs):
        requested.update(kwargs)
        monkeypatch.delenv(PARENT_RUN_ENV)  # the worker is another process, on another machine
        state = flows.dispatch.train_remote(**kwargs["parameters"], return_state=True)
        with get_client(sync_client=True) as client:
            return client.read_flow_run(state.state_details.flow_run_id)

    monkeypatch.setattr(flows.dispatch, "run_deployment", run_deployment)
    swept: list[str] = []
    monkeypatch.setattr(flows.dispatch, "end_orphaned_runs", swept.append)
    monkeypatch.setenv(PARENT_RUN_ENV, "pipeline-run-1")  # as pipeline_run sets it
    parents.clear()
    overrides = [
        "sids.embedding=text",  # as make_settings sets it for every test project
        "orchestration.gpu_deployment=train-remote/train-gpu",
        "orchestration.gpu_timeout_s=4321",
    ]
    settings = make_settings(
        project, orchestration={"gpu_deployment": "train-remote/train-gpu", "gpu_timeout_s": 4321}
    )
    results = flows.dispatch.run_training(settings, "params.yaml", overrides, "evaluate")

    assert requested["name"] == "train-remote/train-gpu"
    assert requested["timeout"] == 4321 and requested["as_subflow"] is True
    assert requested["parameters"] == {
        "config_path": "params.yaml",
        "overrides": overrides,
        "until": "evaluate",
        "parent_run_id": "pipeline-run-1",
    }
    # every parameter but the deployment's own: its accelerate_config (prefect.yaml)
    assert set(requested["parameters"]) | {"accelerate_config"} == set(
        inspect.signature(flows.dispatch.train_remote.fn).parameters
    )
    ((child_settings, until),) = calls
    assert child_settings == settings and until == "evaluate"  # the child loaded the same config
    assert parents == ["pipeline-run-1"]  # its stage runs nest under the pipeline's run
    assert swept == [settings.project.dataset]  # the worker's own orphaned runs, before training
    assert {k: (r.stage, r.metrics) for k, r in results.items()} == {
        "sft": ("sft", {"steps": 3}),
        "evaluate": ("evaluate", {"ks": [10]}),
    }


def _child(state) -> Any:
    from prefect.client.schemas.objects import FlowRun

    return FlowRun(flow_id=uuid.uuid4(), name="train-x", state=state, work_pool_name="gpu")


@pytest.fixture
def gpu_settings(project, make_settings):
    return make_settings(
        project, orchestration={"gpu_deployment": "train-remote/train-gpu", "gpu_timeout_s": 60}
    )


def test_failed_child_run_fails_with_its_state(gpu_settings, monkeypatch):
    from prefect.states import Failed

    import flows.dispatch

    monkeypatch.setattr(
        flows.dispatch, "run_deployment", lambda **_: _child(Failed(message="CUDA out of memory"))
    )
    with pytest.raises(flows.dispatch.TrainingRunFailed, match="ended Failed: CUDA out of memory"):
        flows.dispatch.run_training(gpu_settings, "params.yaml", [], "evaluate")


@pytest.mark.parametrize(
    ("now", "said", "after"),
    [
        ("Scheduled", "It was cancelled.", "CANCELLED"),  # no worker took it
        ("Running", r"It was told to stop \(Cancelling\).", "CANCELLING"),  # its worker kills it
        ("Completed", "It ended Completed meanwhile.", "COMPLETED"),
    ],
)
def test_a_child_run_the_parent_stops_waiting_for_is_cancelled(
    gpu_settings, prefect_harness, monkeypatch, now, said, after
):
    """The parent's failure releases the dataset's lock: a child a gpu worker picked up later
    would otherwise train beside the next retrain."""
    import prefect.states
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    import flows.dispatch

    @flow(name="train-placeholder")
    def placeholder() -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(placeholder, state=getattr(prefect.states, now)())
    waited = run.model_copy(update={"state": Scheduled(), "work_pool_name": "gpu"})  # at timeout
    monkeypatch.setattr(flows.dispatch, "run_deployment", lambda **_: waited)
    with pytest.raises(
        flows.dispatch.TrainingRunFailed,
        match=rf"gpu_timeout_s=60 s \(state Scheduled\).*'gpu'\? {said}",
    ):
        flows.dispatch.run_training(gpu_settings, "params.yaml", [], "evaluate")
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).state.type.value == after


def test_missing_deployment_is_a_config_error(gpu_settings, monkeypatch):
    from prefect.exceptions import ObjectNotFound

    import flows.dispatch
    from sidrec.errors import ConfigError

    def missing(**_):
        raise ObjectNotFound(http_exc=Exception("404"))

    monkeypatch.setattr(flows.dispatch, "run_deployment", missing)
    with pytest.raises(ConfigError, match="no deployment 'train-remote/train-gpu'"):
        flows.dispatch.run_training(gpu_settings, "params.yaml", [], "evaluate")
