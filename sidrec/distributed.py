"""Which process this is when a training stage runs under ``accelerate launch``.

``sidrec sft`` and ``sidrec grpo`` run unchanged as N processes (``accelerate launch
--num_processes N -m sidrec sft``): each trains on its own shard of the data (transformers and
TRL shard the dataloader), while the files, the metrics and the MLflow run are the main
process's alone. Everything else (the data stages, evaluate, register, the Prefect flows) runs
as one process.

The rank and the number of processes come from the launcher's environment (torchrun and
DeepSpeed set ``RANK``/``WORLD_SIZE``, MPI its own names), so they are known before the trainer
creates the process group. The collectives below are no-ops in a single process.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from sidrec.errors import SidrecError

T = TypeVar("T")

_RANK_ENV = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
_WORLD_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
"""The variables accelerate itself reads (``accelerate.utils.get_cpu_distributed_information``)."""


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        if value := os.environ.get(name):
            return int(value)
    return default


def process_rank() -> int:
    """This process's rank among the launched ones (0 outside a launcher)."""
    return _env_int(_RANK_ENV, 0)


def world_size() -> int:
    """How many processes the launcher started (1 outside a launcher)."""
    return _env_int(_WORLD_ENV, 1)


LAUNCH_HINT = (
    "set orchestration.accelerate_config to train sft and grpo under accelerate launch, or "
    "launch `sidrec sft` / `sidrec grpo` themselves"
)
"""What to do instead of launching a whole pipeline or flow as several processes."""


def require_one_process(what: str, hint: str = LAUNCH_HINT) -> None:
    """Refuse to run ``what`` as one of several launched processes: each would run all of it
    (every stage, once per process, racing on the same files and registry). ``hint`` says
    what to launch instead."""
    if world_size() > 1:
        raise SidrecError(
            f"{what} runs as one process, not under accelerate launch with {world_size()} "
            f"processes; {hint}"
        )


def is_main_process() -> bool:
    """True for the one process that writes files, metrics and MLflow runs."""
    return process_rank() == 0


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def broadcast_from_main(value: T) -> T:
    """The main process's ``value`` on every process (any picklable object)."""
    if not _initialized():
        return value
    import torch.distributed as dist

    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_all(value: T) -> list[T]:
    """Every process's ``value``, in rank order, on every process."""
    if not _initialized():
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def barrier() -> None:
    """Wait until every process reaches this point."""
    if _initialized():
        import torch.distributed as dist

        dist.barrier()
