"""MLflow tracking: one parent run per pipeline run, one nested run per stage execution.

Everything lands in the experiment ``sidrec-<dataset>`` of the embedded default
``sqlite:///mlflow.db`` (artifacts under ``./mlruns``) unless ``MLFLOW_TRACKING_URI`` points
at a server. Called from flows and task wrappers (and the register stage), never from
model code.

How runs nest. MLflow keeps the active run per *thread*, but Prefect may run a task in another
thread than its flow, and a child deployment in another process. So :func:`pipeline_run`
publishes the parent's id in the environment variable :data:`PARENT_RUN_ENV`, and
:func:`stage_run` starts each stage's run with ``parent_run_id=`` from it. A process that runs
part of a pipeline (a child flow on the ``gpu`` pool) gets the id as a flow parameter and calls
:func:`use_parent_run`.

Runs that lose their process. Every run records the host, pid and process start time that
created it (tags ``sidrec.host``, ``sidrec.pid``, ``sidrec.pid_started``). An interrupted run
(SIGINT, or SIGTERM through :class:`Terminated`, which the CLI installs) ends ``KILLED``. A
process killed with SIGKILL cannot end its runs, so :func:`pipeline_run` first sweeps the
experiment (:func:`end_orphaned_runs`): a ``RUNNING`` run created on this host by a process
that no longer exists (no such pid, or a pid reused by a process started at another time) is
ended ``KILLED``. A run of another host, or of a live process, is never touched.

Trainers. transformers' ``MLflowCallback`` (``report_to=["mlflow"]``, used by TRL) logs into
the run that is active in its thread when training starts and then leaves it open; so a stage
that trains wraps ``trainer.train()`` in ``with stage_run(...)`` and the trainer's parameters,
losses and evaluation metrics become part of the stage's nested run. Under ``accelerate
launch`` only the main process opens it (:func:`training_run`).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidrec import process
from sidrec.errors import SidrecError

if TYPE_CHECKING:
    from mlflow.entities import Run

log = logging.getLogger(__name__)
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
PARENT_RUN_ENV = "SIDREC_MLFLOW_PARENT_RUN_ID"
"""Environment variable holding the pipeline's parent run id while a pipeline runs."""
MAX_PARAM_LENGTH = 6000
"""MLflow rejects longer parameter values; longer ones are cut (and marked) instead."""
SERVER_TIMEOUT_S = (5.0, 30.0)
"""(connect, read) seconds :func:`require_server` gives the tracking server to answer."""


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)


def require_server(uri: str | None = None) -> None:
    """Stop at once, naming the server, when the tracking URI (default: :func:`tracking_uri`)
    is an http(s) server that does not answer; file and database URIs pass. MLflow itself
    retries a refused connection for about four minutes (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``)
    before it fails, so a stage would otherwise wait that long and then end on a bare client
    error. Any HTTP answer counts as reachable (a proxy may not route ``/health``). Asked at
    every connection, not once per process: a long-lived worker's server may go away between
    two flow runs (one request on loopback is a few milliseconds)."""
    uri = uri or tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=SERVER_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ServerUnreachable(uri, exc) from None


class ServerUnreachable(SidrecError):
    """The MLflow tracking server named by ``MLFLOW_TRACKING_URI`` does not answer."""

    def __init__(self, uri: str, reason: Exception) -> None:
        self.uri = uri
        super().__init__(
            f"cannot reach the MLflow tracking server {uri} ({type(reason).__name__}: "
            f"{reason}); is it running? (MLFLOW_TRACKING_URI names it; unset, runs go to "
            f"{DEFAULT_TRACKING_URI})"
        )


def experiment_name(dataset: str) -> str:
    return f"sidrec-{dataset}"


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (MLflow params are flat)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, child in value.items():
            out |= flatten(f"{prefix}.{key}" if prefix else str(key), child)
        return out
    return {prefix: value}


def metric_key(name: str) -> str:
    """MLflow metric and tag names allow no ``@``: ``test.ndcg@10`` → ``test.ndcg_at_10``."""
    return name.replace("@", "_at_")


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM (:func:`raise_on_sigterm`), so a terminated run
    unwinds like an interrupted one: outputs stay unwritten, MLflow runs end ``KILLED``."""


def raise_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` in this (main) thread."""

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def process_tags() -> dict[str, str]:
    """Which process on which host created a run (see the module doc)."""
    name, pid, start = process.current()
    return {"sidrec.host": name, "sidrec.pid": str(pid), "sidrec.pid_started": repr(start)}


def _process_alive(pid: str, started: str) -> bool:
    try:
        return process.alive(int(pid), float(started))
    except ValueError:  # a tag that is not a number: no process of ours wrote it
        return False


def end_orphaned_runs(dataset: str) -> list[str]:
    """End ``KILLED`` every ``RUNNING`` run of the dataset's experiment that this host's
    processes created and whose process is gone; returns their ids."""
    import mlflow
    from mlflow.tracking import MlflowClient

    _connect(dataset)
    experiment = mlflow.get_experiment_by_name(experiment_name(dataset))
    if experiment is None:
        return []
    client = MlflowClient()
    host = process.host().replace("'", "")
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"attributes.status = 'RUNNING' and tags.`sidrec.host` = '{host}'",
    )
    ended = []
    for run in runs:
        tags = run.data.tags
        pid, started = tags.get("sidrec.pid", ""), tags.get("sidrec.pid_started", "")
        if not pid or _process_alive(pid, started):
            continue
        client.set_tag(run.info.run_id, "sidrec.ended_by", f"orphan sweep of pid {os.getpid()}")
        client.set_terminated(run.info.run_id, "KILLED")
        ended.append(run.info.run_id)
    if ended:
        log.warning(
            "ended %d MLflow run(s) KILLED whose process on this host is gone: %s",
            len(ended),
            ", ".join(ended),
        )
    return ended


@contextmanager
def _killed_on_interrupt(run_id: str) -> Iterator[None]:
    """End the run ``KILLED`` (not ``FAILED``) when the block is interrupted: Ctrl-C, SIGTERM
    (:class:`Terminated` outside a flow; inside one Prefect raises its own ``TerminationSignal``),
    ``SystemExit`` — any ``BaseException`` that is not an error."""
    import mlflow

    try:
        yield
    except BaseException as exc:
        if isinstance(exc, Exception | GeneratorExit):
            raise
        _release_unwound_frames(exc)
        try:
            while (active := mlflow.active_run()) is not None:  # runs a trainer left open first
                mlflow.end_run("KILLED")
                if active.info.run_id == run_id:
                    break
        except Exception as error:  # the interrupt stays what this process ends with
            log.warning(
                "could not end MLflow run %s KILLED (%s); it stays RUNNING until the next "
                "pipeline run on this host ends it (its process is then gone)",
                run_id,
                error,
            )
        raise


def _release_unwound_frames(exc: BaseException) -> None:
    """Drop the local variables of the frames an interrupt has unwound (its traceback keeps
    them alive while it is handled), then collect.

    A signal can land between a database read and the read's last fetch. The half-read cursor
    in such a frame keeps SQLite's shared lock on ``mlflow.db`` even after its connection is
    rolled back or closed, and ending the run, a write, would then wait out MLflow's busy
    timeout on a lock this process holds itself ("database is locked"). Frames still running
    (this one and its callers) are left as they are.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
    gc.collect()


def parent_run_id() -> str | None:
    """The pipeline's parent run id, when this process runs inside a pipeline."""
    return os.environ.get(PARENT_RUN_ENV) or None


def _connect(dataset: str) -> None:
    import mlflow

    logging.getLogger("alembic").setLevel(logging.WARNING)  # database migrations on first use
    require_server()
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment_name(dataset))


def _param_values(params: Mapping[str, Any]) -> dict[str, str]:
    flat = {key: str(value) for key, value in flatten("", params).items()}
    return {
        key: value if len(value) <= MAX_PARAM_LENGTH else value[: MAX_PARAM_LENGTH - 3] + "..."
        for key, value in flat.items()
    }


@contextmanager
def use_parent_run(run_id: str | None) -> Iterator[None]:
    """Nest the stage runs started inside the block under ``run_id`` (no-op for ``None``).

    For a process that runs part of a pipeline started elsewhere (a child deployment): the
    parent flow passes :func:`parent_run_id` as a parameter, the child wraps its work in this.
    """
    if run_id is None:
        yield
        return
    before = os.environ.get(PARENT_RUN_ENV)
    os.environ[PARENT_RUN_ENV] = run_id
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARENT_RUN_ENV, None)
        else:
            os.environ[PARENT_RUN_ENV] = before


@contextmanager
def pipeline_run(
    *, dataset: str, params: Mapping[str, Any], run_name: str = "pipeline"
) -> Iterator[str]:
    """The parent run of one pipeline run; yields its id.

    ``params``: the resolved configuration (``settings.to_yaml_dict()``), logged flattened
    (``sft.learning_rate``). Stage runs started inside the block — in any thread of this
    process — are nested under it. The run ends FINISHED, or FAILED when the block raises.
    """
    import mlflow

    end_orphaned_runs(dataset)
    with (
        mlflow.start_run(
            run_name=run_name,
            nested=mlflow.active_run() is not None,
            tags={"sidrec.dataset": dataset, "sidrec.kind": "pipeline", **process_tags()},
        ) as run,
        _killed_on_interrupt(run.info.run_id),
        use_parent_run(run.info.run_id),
    ):
        mlflow.log_params(_param_values(params))
        log.info("MLflow parent run %s (%s)", run.info.run_id, tracking_uri())
        yield str(run.info.run_id)


@contextmanager
def stage_run(
    *, dataset: str, stage: str, params: Mapping[str, Any] | None = None
) -> Iterator[Run]:
    """One stage's MLflow run, active in this thread for the block; nested under the pipeline's
    parent run when there is one. Yields the run (``run.info.run_id``).

    Inside the block ``mlflow.log_*`` calls and transformers/TRL trainers (``report_to=["mlflow"]``)
    log into this run. Trainers log their own arguments as flat params (``learning_rate``), and
    MLflow refuses to change a param's value, so a training stage passes its own params under
    its section name: ``params={"sft": settings.section("sft")}``.
    """
    import mlflow

    _connect(dataset)
    active = mlflow.active_run()
    parent = parent_run_id()
    if active is not None and parent is not None and active.info.run_id != parent:
        parent = None  # something else is active in this thread: nest under it instead
    with (
        mlflow.start_run(
            run_name=stage,
            nested=active is not None,
            parent_run_id=parent,
            tags={"sidrec.stage": stage, "sidrec.dataset": dataset, **process_tags()},
        ) as run,
        _killed_on_interrupt(run.info.run_id),
    ):
        if params:
            mlflow.log_params(_param_values(params))
        yield run
    log.info("logged %s to MLflow run %s (%s)", stage, run.info.run_id, tracking_uri())


@contextmanager
def training_run(
    *, dataset: str, stage: str, params: Mapping[str, Any] | None = None
) -> Iterator[Run | None]:
    """:func:`stage_run` for a stage that trains, which may run as several processes
    (``accelerate launch``, :mod:`sidrec.distributed`): the main process opens the stage's run;
    the others open none and log nothing (transformers' ``MLflowCallback`` logs from the main
    process only), so a run on N processes is one MLflow run. Yields None on those."""
    from sidrec.distributed import is_main_process

    if not is_main_process():
        yield None
        return
    with stage_run(dataset=dataset, stage=stage, params=params) as run:
        yield run


def log_stage(
    *,
    dataset: str,
    stage: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    artifacts: Sequence[Path] = (),
) -> str:
    """Log one finished stage (params, metrics, artifact files) as a run; returns its id."""
    import mlflow

    with stage_run(dataset=dataset, stage=stage, params=params) as run:
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        for path in artifacts:
            mlflow.log_artifact(str(path))
    return str(run.info.run_id)
