"""A training stage as ``accelerate launch`` processes, started by a Prefect task
(``orchestration.accelerate_config``; the ``train-gpu`` deployment sets it).

The flow stays one process; the stage runs as ``accelerate launch --config_file <config>
--num_processes N -m sidrec <stage> --config <the flow's resolved configuration>``, the command a
user types on a GPU machine, in the same project folder and environment (so its MLflow run
nests under the pipeline's run, :mod:`sidrec.tracking`). Its main process writes the model and
the metrics; the task reads the metrics back into the stage's result.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from sidrec.config import Settings, save_run_config
from sidrec.errors import ConfigError
from sidrec.io import read_json

log = logging.getLogger(__name__)

LaunchedStage = Literal["sft", "grpo"]


class LaunchFailed(RuntimeError):
    """The launched processes exited with an error (their output tells which and why)."""


def launch_processes(settings: Settings) -> int:
    """``orchestration.num_processes``, else one per visible GPU (at least one)."""
    if settings.orchestration.num_processes is not None:
        return settings.orchestration.num_processes
    import torch

    return max(1, torch.cuda.device_count())


def launch_command(settings: Settings, stage: LaunchedStage, config: Path) -> list[str]:
    """The ``accelerate launch`` command line that runs ``sidrec <stage>`` with ``config``."""
    accelerate_config = settings.orchestration.accelerate_config
    assert accelerate_config is not None, "only called when orchestration.accelerate_config is set"
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(accelerate_config),
        "--num_processes",
        str(launch_processes(settings)),
        "-m",
        "sidrec",
        stage,
        "--config",
        str(config),
    ]


def run_launched(settings: Settings, stage: LaunchedStage) -> dict[str, Any]:
    """Run the stage under ``accelerate launch`` and return the metrics its main process wrote."""
    accelerate_config = settings.orchestration.accelerate_config
    if accelerate_config is None or not accelerate_config.is_file():
        raise ConfigError(
            f"orchestration.accelerate_config: no Accelerate config file at {accelerate_config} "
            "(docker/accelerate/ holds ddp.yaml, deepspeed_zero2.yaml and fsdp.yaml); set it to "
            "one of them, or to null to train in the flow's process"
        )
    config = save_run_config(settings, f"{stage}-launch")  # reloads as these settings
    command = launch_command(settings, stage, config)
    log.info("%s: %s", stage, " ".join(command))
    # in the flow run's process group: a signal to the group (Ctrl-C, a worker stopping the
    # run) reaches the launched processes too
    proc = subprocess.Popen(command)
    try:
        code = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    if code != 0:
        raise LaunchFailed(
            f"`sidrec {stage}` under accelerate launch exited with code {code} (its processes' "
            "output is above); nothing of the stage was kept"
        )
    return dict(
        read_json(settings.paths.metrics(stage), f"{stage} metrics", "the launched run wrote none")
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the launcher, which passes it to its processes (each ends its MLflow run
    KILLED and writes nothing); SIGKILL if it has not exited within a minute."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
