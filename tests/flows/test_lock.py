"""One retrain per dataset at a time (flows/lock.py), across every deployment and the CLI:
runs of the ``retrain`` flow against one Prefect API, with the stages replaced by a stand-in
that records when it starts and ends and, for a gated dataset, holds until the test opens it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sidrec.stage import StageResult

WAIT_S = 60
"""The longest any step waits: only a broken test ever gets near it."""


class Stages:
    """Stands in for the retrain flow's stages: records ``(dataset, "start" | "end")`` and, for a
    dataset with a gate, waits until the gate opens before it ends."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.gates: dict[str, threading.Event] = {}
        self.fail: set[str] = set()
        self._changed = threading.Condition()

    def gate(self, dataset: str) -> threading.Event:
        return self.gates.setdefault(dataset, threading.Event())

    def run(self, settings: Any, *_: Any) -> dict[str, StageResult]:
        dataset = settings.project.dataset
        self._record(dataset, "start")
        if dataset in self.fail:
            raise RuntimeError(f"stage of {dataset} failed")
        gate = self.gates.get(dataset)
        assert gate is None or gate.wait(WAIT_S), f"{dataset}: the test never opened the gate"
        self._record(dataset, "end")
        return {}

    def _record(self, dataset: str, what: str) -> None:
        with self._changed:
            self.events.append((dataset, what))
            self._changed.notify_all()

    def count(self, dataset: str, what: str = "start") -> int:
        return self.events.count((dataset, what))


@pytest.fixture
def stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stages]:
    import contextlib

    import flows.retrain

    fake = Stages()
    monkeypatch.setattr(flows.retrain, "_run_stages", fake.run)
    # runs share this process here: no MLflow parent run (it is named in process-wide state)
    monkeypatch.setattr(
        flows.retrain, "pipeline_run", lambda **_: contextlib.nullcontext("no-mlflow")
    )
    yield fake
    for gate in fake.gates.values():  # a failed test lets its runs finish at once
        gate.set()


@pytest.fixture
def run_logs() -> Iterator[list[str]]:
    """The messages flow runs log (Prefect's run logger), as they come."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Keep(level=logging.INFO)
    logger = logging.getLogger("prefect.flow_runs")
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=3) as executor:
        yield executor


def _retrain(project: Path, dataset: str, *overrides: str) -> Callable[[], Any]:
    from flows.retrain import retrain

    return lambda: retrain(
        config_path=str(project / "params.yaml"), overrides=list(overrides), dataset=dataset
    )


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.05)


def _waits(messages: list[str]) -> bool:
    return any("waits for another retrain" in m for m in messages)


def test_two_retrains_of_one_dataset_never_overlap(
    project, prefect_harness, pool, stages, run_logs
) -> None:
    """The second run of a dataset starts its stages only once the first has ended: it says it
    waits, and goes on when the first releases the dataset."""
    gate = stages.gate("lockds")
    first: Future[Any] = pool.submit(_retrain(project, "lockds"))
    _until(lambda: stages.count("lockds") == 1 or first.done(), "the first run's stages")
    second: Future[Any] = pool.submit(_retrain(project, "lockds"))
    # either the second run waits for the first (the lock) or its stages start beside them
    _until(
        lambda: _waits(run_logs) or stages.count("lockds") > 1 or second.done(),
        "the second run to wait or to start",
    )
    assert stages.events == [("lockds", "start")], "the second run started beside the first"
    gate.set()
    first.result(WAIT_S)
    second.result(WAIT_S)
    assert stages.events == [("lockds", "start"), ("lockds", "end")] * 2


def test_retrains_of_other_datasets_do_not_wait(
    project, prefect_harness, pool, stages, run_logs, active_slots
) -> None:
    from flows.lock import lock_name

    held = stages.gate("lockheld")
    first = pool.submit(_retrain(project, "lockheld"))
    _until(lambda: stages.count("lockheld") == 1 or first.done(), "the first run's stages")
    _retrain(project, "lockother")()  # in this thread: it must finish while the first holds
    assert stages.events == [
        ("lockheld", "start"),
        ("lockother", "start"),
        ("lockother", "end"),
    ]
    assert not _waits(run_logs)
    held.set()
    first.result(WAIT_S)
    assert {active_slots(lock_name(d)) for d in ("lockheld", "lockother")} == {0}


def test_a_failed_retrain_releases_its_dataset(
    project, prefect_harness, stages, active_slots
) -> None:
    from flows.lock import lock_name

    stages.fail.add("lockfail")
    # a slot left taken would make the next run time out after 5 s, not wait a day
    with pytest.raises(RuntimeError, match="stage of lockfail failed"):
        _retrain(project, "lockfail", "orchestration.lock_timeout_s=5")()
    assert active_slots(lock_name("lockfail")) == 0
    stages.fail.clear()
    _retrain(project, "lockfail", "orchestration.lock_timeout_s=5")()
    assert stages.events[-2:] == [("lockfail", "start"), ("lockfail", "end")]


def test_an_interrupted_holder_releases_the_lock(prefect_harness, active_slots) -> None:
    """Cancelling a run (the worker's SIGTERM) or Ctrl-C unwinds as a BaseException."""
    from flows.lock import dataset_lock, lock_name

    class Interrupted(BaseException):
        pass

    with pytest.raises(Interrupted), dataset_lock("lockint", timeout_s=5):
        assert active_slots(lock_name("lockint")) == 1
        raise Interrupted
    assert active_slots(lock_name("lockint")) == 0


def test_waiting_longer_than_the_timeout_names_the_limit_and_the_fix(prefect_harness) -> None:
    from flows.lock import RetrainLockTimeout, dataset_lock

    with (
        dataset_lock("locktime", timeout_s=5),
        pytest.raises(RetrainLockTimeout) as error,
        dataset_lock("locktime", timeout_s=1),
    ):
        pytest.fail("took a slot another holder has")
    message = str(error.value)
    assert "'sidrec-retrain-locktime'" in message and "lock_timeout_s=1" in message
    assert "prefect gcl update sidrec-retrain-locktime --active-slots 0" in message
    with dataset_lock("locktime", timeout_s=5):  # released by its holder, never by the timeout
        pass


def test_the_gpu_child_of_a_retrain_does_not_wait_for_its_parent(
    project, prefect_harness, monkeypatch, run_logs
) -> None:
    """The parent holds the dataset while it waits for its training child: the child must not
    take it again (each would wait for the other until the timeout)."""
    from prefect.client.orchestration import get_client

    import flows.dispatch
    import flows.retrain
    import flows.train

    trained: list[str] = []

    def train_recommender(settings, until="evaluate"):
        trained.append(settings.project.dataset)
        return {"sft": StageResult(stage="sft", outputs={}, metrics={})}

    def run_deployment(**kwargs):  # the gpu worker, here: the child runs as a subflow
        state = flows.dispatch.train_remote(**kwargs["parameters"], return_state=True)
        with get_client(sync_client=True) as client:
            return client.read_flow_run(state.state_details.flow_run_id)

    monkeypatch.setattr(flows.train, "train_recommender", train_recommender)
    monkeypatch.setattr(flows.dispatch, "run_deployment", run_deployment)
    monkeypatch.setattr(flows.dispatch, "end_orphaned_runs", lambda _: [])
    monkeypatch.setattr(flows.retrain, "prepare_data", lambda settings, until: {})
    monkeypatch.setattr(flows.retrain, "build_sids", lambda settings, until: {})
    results = flows.retrain.retrain(
        config_path=str(project / "params.yaml"),
        overrides=[
            "orchestration.gpu_deployment=train-remote/train-gpu",
            "orchestration.lock_timeout_s=5",  # a child that waited would fail, not hang
        ],
        dataset="lockgpu",
        until="evaluate",
    )
    assert trained == ["lockgpu"] and set(results) == {"sft"}
    assert not _waits(run_logs)


def test_a_training_run_started_on_its_own_takes_the_dataset(
    project, prefect_harness, monkeypatch
) -> None:
    """``train-gpu`` run by hand writes the dataset's models and metrics too."""
    import flows.dispatch
    from flows.lock import RetrainLockTimeout, dataset_lock

    monkeypatch.setattr(flows.dispatch, "end_orphaned_runs", lambda _: [])
    with dataset_lock("lockalone", timeout_s=5), pytest.raises(RetrainLockTimeout):
        flows.dispatch.train_remote(
            config_path=str(project / "params.yaml"),
            overrides=["project.dataset=lockalone", "orchestration.lock_timeout_s=1"],
        )


def test_without_a_prefect_server_no_lock_is_taken(monkeypatch) -> None:
    """The ephemeral API (`make run`, no PREFECT_API_URL) runs no lease expiry: a slot a killed
    run left taken would stay taken, so the local CLI takes none."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.lock import dataset_lock

    def no_api(*_: Any, **__: Any) -> None:
        raise AssertionError("asked the Prefect API for a lock")

    monkeypatch.setattr("flows.lock.get_client", no_api)
    with temporary_settings(restore_defaults={PREFECT_API_URL}), dataset_lock("local", timeout_s=1):
        pass
