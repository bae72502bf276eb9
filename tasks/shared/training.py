"""What every trainer of the project shares: TRL/transformers arguments (output folder, run
name, optimizer basics, seed, MLflow reporting, device) and the LoRA configuration."""

from __future__ import annotations

from typing import Any, Literal

from sidrec.config import Settings


def trainer_arguments(
    settings: Settings, stage: Literal["sft", "grpo"], **stage_args: Any
) -> dict[str, Any]:
    """Keyword arguments for ``SFTConfig`` / ``SidGRPOConfig``: the shared ones from the
    stage's section and the runtime, then ``stage_args`` (the stage's own)."""
    import torch

    from sidrec.progress import interactive

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
