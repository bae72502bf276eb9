"""Where the training stages run: inline in the parent flow, or on the ``gpu`` work pool.

``orchestration.gpu_deployment`` (``"<flow>/<deployment>"``, e.g. ``train-remote/train-gpu``
from ``prefect.yaml``) makes :func:`run_training` start the deployed :func:`train_remote`
flow as a child run of the current flow and wait for it; without it the stages run in
this process. Either way the caller gets the same ``dict[str, StageResult]``.

The child run re-reads the configuration from ``config_path`` + ``overrides`` on the worker
that picks it up, so both machines must see the same project folder (the compose stack
mounts shared volumes) and the same result storage (``PREFECT_LOCAL_STORAGE_PATH``):
the child's return value travels as a persisted Prefect result, not through the API.

The parent holds the dataset's lock (flows/lock.py) while it waits for the child, so the
child takes none; a :func:`train_remote` run started on its own takes it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from prefect import flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from flows.common import run_logger
from flows.lock import dataset_lock
from sidrec.config import Settings, load_settings
from sidrec.distributed import require_one_process
from sidrec.errors import ConfigError
from sidrec.stage import Stage, StageResult
from sidrec.tracking import end_orphaned_runs, use_parent_run
from sidrec.tracking import parent_run_id as pipeline_parent_run

FLOW_NAME = "train-remote"
"""The deployable training flow's name: deployments of it are ``train-remote/<name>``."""


class TrainingRunFailed(RuntimeError):
    """The training deployment's child run ended in a state other than Completed."""


@flow(name=FLOW_NAME, persist_result=True)
def train_remote(
    config_path: str = "params.yaml",
    overrides: list[str] | None = None,
    until: Stage = "evaluate",
    accelerate_config: str | None = None,
    parent_run_id: str | None = None,
) -> dict[str, StageResult]:
    """The training stages (baselines → sft → grpo → evaluate), run by whichever worker picks
    the run up.

    Args:
        config_path: the configuration file, relative to the worker's project folder.
        overrides: ``section.key=value`` overrides, applied as ``--set`` does.
        until: the last stage to run.
        accelerate_config: an Accelerate config file: sft and grpo run under ``accelerate
            launch`` with it, one process per GPU (``orchestration.accelerate_config``; the
            ``train-gpu`` deployment sets it, the parent run never passes it).
        parent_run_id: the MLflow run of the pipeline that started this one: the stages' runs
            nest under it (None: they are top-level runs).
    """
    require_one_process(f"the {FLOW_NAME} flow")  # it launches sft and grpo itself
    if accelerate_config is not None:  # last, so it wins as the deployment's own setting
        overrides = [*(overrides or []), f"orchestration.accelerate_config={accelerate_config}"]
    settings = load_settings(config_path, overrides or [])
    with _lock_unless_a_child(settings):
        # runs a killed process of this worker left RUNNING (the parent flow sweeps its own host)
        end_orphaned_runs(settings.project.dataset)
        with use_parent_run(parent_run_id):
            return _train_inline(settings, until)


def _lock_unless_a_child(settings: Settings) -> AbstractContextManager[None]:
    """The dataset's lock (flows/lock.py) for a run started on its own (``train-gpu`` run by
    hand); none for the child run of a retrain, whose parent holds the lock while it waits for
    the child: taking it again would wait for the parent, which waits for the child."""
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None and ctx.flow_run.parent_task_run_id:
        return nullcontext()
    return dataset_lock(settings.project.dataset, timeout_s=settings.orchestration.lock_timeout_s)


def run_training(
    settings: Settings,
    config_path: str,
    overrides: list[str] | None,
    until: Stage,
) -> dict[str, StageResult]:
    """Run the training stages where ``settings.orchestration`` says and return their results.

    ``config_path`` and ``overrides`` must be the ones ``settings`` was loaded from: the child
    run loads its settings from them.
    """
    deployment = settings.orchestration.gpu_deployment
    if deployment is None:
        return _train_inline(settings, until)
    parameters: dict[str, Any] = {
        "config_path": config_path,
        "overrides": list(overrides or []),
        "until": until,
        "parent_run_id": pipeline_parent_run(),  # the child's stage runs nest under it too
    }
    return _train_on_deployment(deployment, parameters, settings)


def _train_inline(settings: Settings, until: Stage) -> dict[str, StageResult]:
    # imported here: flows.train imports the heavy model code, and the retrain flow that
    # imports this module may not need it at all (training on another machine)
    from flows.train import train_recommender

    return train_recommender(settings, until=until)


def _train_on_deployment(
    deployment: str, parameters: dict[str, Any], settings: Settings
) -> dict[str, StageResult]:
    timeout = settings.orchestration.gpu_timeout_s
    run_logger().info("training on deployment %s (waiting up to %d s)", deployment, timeout)
    try:
        # called from a sync flow: run_deployment returns the FlowRun, not a coroutine
        child = run_deployment(
            name=deployment,
            parameters=parameters,
            timeout=timeout,
            as_subflow=True,
            flow_run_name=f"train-{settings.project.dataset}",
            tags=["sidrec", settings.project.dataset],
        )
    except ObjectNotFound:
        raise ConfigError(
            f"orchestration.gpu_deployment: no deployment {deployment!r} on the Prefect API; "
            "deploy it first (`prefect deploy --name train-gpu`) or set the key to null "
            "to train inline"
        ) from None
    assert isinstance(child, FlowRun)
    return _child_results(child, deployment, timeout)


def _cancel(child: FlowRun) -> str:
    """Cancel a child run the parent stops waiting for: the parent's failure releases the
    dataset's lock, and a gpu worker that picked the child up later would train beside the
    next retrain. A run not started yet is cancelled outright; a running one is asked to stop
    (its worker kills it). Returns what became of it, for the error message."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Cancelled, Cancelling

    reason = "the parent flow stopped waiting (orchestration.gpu_timeout_s)"
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(child.id).state  # it may have moved since the wait
            if state is not None and state.is_final():
                return f"It ended {state.name} meanwhile."
            running = state is not None and state.is_running()
            stop: State[Any] = Cancelling(message=reason) if running else Cancelled(message=reason)
            result = client.set_flow_run_state(child.id, stop)
    except Exception as exc:  # the API unreachable: say so, the parent fails either way
        return (
            f"It could not be cancelled ({type(exc).__name__}: {exc}): cancel it in the UI "
            "before the next retrain."
        )
    if result.status != SetStateStatus.ACCEPT:
        return f"The API did not cancel it ({result.status.value}): cancel it in the UI."
    return "It was told to stop (Cancelling)." if running else "It was cancelled."


def _child_results(child: FlowRun, deployment: str, timeout: int) -> dict[str, StageResult]:
    """The child run's return value, or an error naming its state when it did not complete."""
    state = child.state
    where = f"training run {child.name!r} ({child.id}) of deployment {deployment!r}"
    if state is None or not state.is_final():
        raise TrainingRunFailed(
            f"{where} did not finish within orchestration.gpu_timeout_s={timeout} s "
            f"(state {state.name if state else 'unknown'}); is a worker polling work pool "
            f"{child.work_pool_name!r}? {_cancel(child)}"
        )
    if not state.is_completed():
        raise TrainingRunFailed(f"{where} ended {state.name}: {state.message or 'no message'}")
    try:
        results = state.result()
    except Exception as exc:  # the storage backend decides the type (missing file, no record, ...)
        raise TrainingRunFailed(
            f"{where} completed but its result could not be read ({type(exc).__name__}: {exc}); "
            "the parent flow and the gpu worker must share result storage "
            "(the same PREFECT_LOCAL_STORAGE_PATH on a shared volume)"
        ) from exc
    if not isinstance(results, dict) or not all(
        isinstance(r, StageResult) for r in results.values()
    ):
        raise TrainingRunFailed(
            f"{where} returned {type(results).__name__}, expected dict[str, StageResult]"
        )
    return results
