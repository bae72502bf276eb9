"""How a flow runs its steps: each stage task in order, as far as ``until``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import cast

from prefect import Task, get_run_logger
from prefect.exceptions import MissingContextError
from prefect.settings import PREFECT_API_URL

from sidrec.config import Settings
from sidrec.stage import STAGES, Stage, StageResult, reaches

log = logging.getLogger(__name__)


def run_steps(
    steps: Sequence[Task[..., StageResult]], settings: Settings, until: Stage
) -> dict[str, StageResult]:
    """Run the stage tasks in order (a task is named after its stage), stopping after ``until``."""
    results: dict[str, StageResult] = {}
    for step in steps:
        assert step.name in STAGES, f"task {step.name!r} is not named after a stage"
        if not reaches(until, cast(Stage, step.name)):
            break
        results[step.name] = run_stage(step, settings)
    return results


def run_stage(stage_task: Task[..., StageResult], settings: Settings) -> StageResult:
    """Run a stage task; if Prefect served it from cache but its outputs were deleted or changed
    on disk since, or the registry no longer holds the version it registered, run it again
    (the cache key covers inputs, not outputs)."""
    result = stage_task(settings)
    if not result.outputs_intact():
        log.info("%s: cached outputs changed on disk, re-running", result.stage)
        result = stage_task.with_options(refresh_cache=True)(settings)
    elif not registration_intact(result):
        log.info("register: the registry no longer holds the cached version, registering again")
        result = stage_task.with_options(refresh_cache=True)(settings)
    return result


def registration_intact(result: StageResult) -> bool:
    """False for a register result whose model version is not in today's registry (the store
    was reset or replaced since); True for every other stage."""
    m = result.metrics
    if result.stage != "register" or m.get("skipped") or "version" not in m:
        return True
    from sidrec.registry import holds_version

    return holds_version(m["model_name"], str(m["version"]), m["run_id"])


def run_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The flow run's logger (its lines show in the Prefect UI), else the module logger."""
    try:
        return get_run_logger()
    except MissingContextError:
        return log


def start_local_api() -> Callable[[], None]:
    """Start Prefect's temporary local API now, when no server is set (``PREFECT_API_URL``), and
    return the function that waits until it answers (raising what its start raised).

    Without a server the first flow run starts that API (a uvicorn subprocess, Prefect's
    ``SubprocessASGIServer``) and waits for it. Started here, in a thread, the subprocess boots
    while this process goes on importing the stages, so ``sidrec pipeline`` starts sooner; the
    flow run then finds it running, as the server is one per process. Its
    module is imported here, not in the thread: the thread's start then imports next to nothing
    (one codec) while this process imports the stages."""
    if PREFECT_API_URL.value():
        return lambda: None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    failed: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:  # re-raised by wait(), in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=start, name="prefect-local-api", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if failed:
            raise failed[0]

    return wait
