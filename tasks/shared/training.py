"""What every trainer of the project shares: TRL/transformers arguments (output folder, run
name, optimizer basics, seed, MLflow reporting, device), the LoRA configuration, and how a
stage trains as several processes (``accelerate launch``, :mod:`sidrec.distributed`): each
process's share of a step, the best model gathered and written once, what each process trained
on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from sidrec.config import Settings
from sidrec.distributed import barrier, gather_all, is_main_process, world_size
from sidrec.errors import ConfigError


def trainer_arguments(
    settings: Settings, stage: Literal["sft", "grpo"], **stage_args: Any
) -> dict[str, Any]:
    """Keyword arguments for ``SFTConfig`` / ``SidGRPOConfig``: the shared ones from the
    stage's section and the runtime, then ``stage_args`` (the stage's own)."""
    import torch

    from sidrec.progress import interactive

    check_launch(settings, stage)
    cfg = settings.sft if stage == "sft" else settings.grpo
    folder = settings.paths.sft_dir if stage == "sft" else settings.paths.grpo_dir
    gpu = torch.cuda.is_available()
    return {
        "output_dir": str(folder / "checkpoints"),
        "run_name": stage,
        "learning_rate": cfg.learning_rate,
        "weight_decay": cfg.weight_decay,
        "seed": settings.project.seed,
        "report_to": ["mlflow"],
        "dataloader_num_workers": 0,
        "bf16": gpu and torch.cuda.is_bf16_supported(),  # bf16 on a GPU that has it
        "use_cpu": not gpu,
        # TRL turns it on by default; off, a step keeps its activations (same weights, faster)
        "gradient_checkpointing": settings.model.gradient_checkpointing,
        "disable_tqdm": not interactive(),  # a log file gets the trainer's log lines instead
        **stage_args,
    }


def lora_config(settings: Settings, modules_to_save: list[str] | None = None) -> Any:
    """peft's LoraConfig from ``model.lora`` (None when LoRA is off)."""
    if not settings.model.lora.enabled:
        return None
    from peft import LoraConfig

    lora = settings.model.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        modules_to_save=modules_to_save,
        task_type="CAUSAL_LM",
    )


def check_launch(settings: Settings, stage: Literal["sft", "grpo"] = "sft") -> None:
    """Refuse the ``accelerate launch`` setups whose parameters the stages cannot gather into one
    saved model: DeepSpeed ZeRO-3 and FSDP version 1 (use ZeRO-2 or FSDP2, whose sharded
    parameters are gathered through ``torch.distributed.checkpoint``), LoRA under FSDP (the
    adapter is merged into the saved model, which needs the whole model in one process), and
    the stage's weight average under FSDP (it averages whole parameters), before any work."""
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        raise ConfigError(
            "DeepSpeed ZeRO-3 is not supported: the best model is saved from one process, which "
            "ZeRO-3's partitioned parameters do not allow; launch with "
            "docker/accelerate/deepspeed_zero2.yaml or docker/accelerate/fsdp.yaml"
        )
    if fsdp and os.environ.get("FSDP_VERSION", "1") != "2":
        raise ConfigError(
            "FSDP version 1 is not supported (validation generates with the model's own "
            "modules); set fsdp_version: 2 in the Accelerate config (docker/accelerate/fsdp.yaml)"
        )
    if fsdp and settings.model.lora.enabled:
        raise ConfigError(
            "model.lora.enabled with FSDP: the saved model merges the adapter, which needs the "
            "whole model in one process; launch LoRA with docker/accelerate/ddp.yaml or "
            "docker/accelerate/deepspeed_zero2.yaml"
        )
    ema = settings.sft.ema_decay if stage == "sft" else settings.grpo.ema_decay
    if fsdp and ema is not None:
        raise ConfigError(
            f"{stage}.ema_decay with FSDP: the moving average keeps whole parameters, which "
            f"FSDP shards; set {stage}.ema_decay=null, or launch with docker/accelerate/ddp.yaml "
            "or docker/accelerate/deepspeed_zero2.yaml"
        )


def per_process(total: int, key: str) -> int:
    """Each process's share of a per-step quantity (``sft.batch_size`` rows, ``grpo.prompts_per_step``
    prompts): the key keeps meaning one optimizer step however many processes train, so a run
    on N processes follows the recipe of a run on one."""
    n = world_size()
    if total % n:
        raise ConfigError(
            f"{key}={total} is not a multiple of the {n} launched processes: every process takes "
            f"an equal share of each optimizer step; set {key} to a multiple of {n} or launch "
            "another number of processes"
        )
    return total // n


def check_enough(available: int, needed: int, what: str, remedy: str) -> None:
    """A clear error before training when the data cannot give every process its share;
    ``remedy`` names the keys that change either side."""
    if available < needed:
        n = world_size()
        launched = f" for {n} processes" if n > 1 else ""
        raise ConfigError(
            f"{available} {what}, but a training step needs at least {needed}{launched}; {remedy}"
        )


def save_trained(model: Any, tokenizer: Any, target: Path) -> None:
    """The model being trained as a ``from_pretrained`` folder at ``target``. Every process
    calls it: FSDP2's sharded parameters are gathered collectively; the main process writes."""
    from models.lm import save_model_dir

    state = _gathered_state(model)
    if is_main_process():
        save_model_dir(model, tokenizer, target, state_dict=state)
    barrier()


def _gathered_state(model: Any) -> dict[str, Any] | None:
    """The full state dict of an FSDP2 model (its parameters are DTensor shards); None for a
    model whose parameters every process holds whole (one process, DDP, ZeRO-2)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return dict(get_model_state_dict(model, options=options))


def shard_records(trainer: Any) -> list[dict[str, Any]]:
    """What each process trained on (``trainer.shard``), in rank order; every process calls it."""
    return gather_all(trainer.shard.as_dict())
