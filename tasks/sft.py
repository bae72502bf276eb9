"""Stage 6 — sft: teach a language model to generate the next item's SID (TRL's SFTTrainer).

``sft.objective`` builds the main task: ``sequence`` trains on windows of each user's train
sequence (every interaction a target, every epoch), ``rows`` on one prompt/completion example
per train row; the alignment tasks mix in. The model is ranked on the validation selection
users every ``sft.eval_every`` epochs exactly as evaluate ranks; the best one is kept and
training stops after ``sft.patience`` validations without improvement.

Writes ``artifacts/sft/<ds>/model`` (model + tokenizer with SID tokens, loads with
``from_pretrained``; its config names the prompt format it was trained with) and
``metrics/sft.json``. Loss on the completion only.

Runs unchanged as several processes (``accelerate launch -m sidrec sft``): each trains on its
shard of every step's ``sft.batch_size`` rows, the main process writes the model, the metrics
and the MLflow run (``tasks/shared/training.py``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
from prefect import task

from models.lm import (
    add_residual_dropout,
    add_sid_tokens,
    build_tiny,
    load_model_dir,
    load_pretrained,
    replace_dir,
    train_tokenizer,
)
from models.prompts import (
    Example,
    PromptBuilder,
    PromptFormat,
    seq_rec_prompt,
    set_prompt_format,
    sid2title_prompt,
    title2sid_prompt,
    title_history_prompt,
)
from models.recommender import SidRecommender
from models.sid import SidMap
from sidrec.config import Settings
from sidrec.distributed import is_main_process, world_size
from sidrec.errors import ConfigError
from sidrec.io import atomic_write_json
from sidrec.orchestration import StageCache, publish_stats
from sidrec.protocol import validation_half
from sidrec.registry import champion_label, champion_start
from sidrec.stage import StageResult
from sidrec.tracking import training_run
from tasks.shared.inputs import (
    check_teacher_ease,
    item_texts,
    load_catalog_and_map,
    read_split,
    recent_rows,
    recommender_options,
    sasrec_teacher,
    sft_windows,
    sid_token_matrix,
    without_recent_rows,
)
from tasks.shared.launch import run_launched
from tasks.shared.training import (
    check_enough,
    lora_config,
    per_process,
    save_trained,
    shard_records,
    trainer_arguments,
)
from tasks.shared.validation import ValidationSample

log = logging.getLogger(__name__)


def sid_shape(sid_map: SidMap, codebook_size: int) -> tuple[int, int]:
    """(levels, codes per level) the vocabulary must cover."""
    levels = len(next(iter(sid_map.values())))
    top = max(max(codes) for codes in sid_map.values()) + 1
    return levels, max(codebook_size, top)


def build_model_and_tokenizer(
    settings: Settings, texts: list[str], levels: int, k: int
) -> tuple[Any, Any]:
    """A fresh model: the tiny preset with its tokenizer trained on the item ``texts`` and the
    prompt templates, or a pretrained one; both with the SID tokens added."""
    cfg = settings.model
    if cfg.preset == "tiny":
        corpus = (
            texts
            + [
                seq_rec_prompt([]),
                title_history_prompt(texts[:3]),
                sid2title_prompt([]),
                title2sid_prompt(""),
            ]
            * 20
        )
        tokenizer = train_tokenizer(corpus, cfg.tiny.vocab_size)
        add_sid_tokens(tokenizer, levels, k)
        t = cfg.tiny
        model = build_tiny(
            tokenizer,
            hidden_size=t.hidden_size,
            layers=t.layers,
            heads=t.heads,
            kv_heads=t.kv_heads,
            intermediate_size=t.intermediate_size,
            max_length=cfg.max_length,
            seed=settings.project.seed,
            tie_embeddings=t.tie_embeddings,
        )
        return model, tokenizer
    model, tokenizer = load_pretrained(cfg.preset, cfg.name_or_path)
    added = add_sid_tokens(tokenizer, levels, k)
    model.resize_token_embeddings(len(tokenizer))
    log.info("added %d SID tokens to %s", added, cfg.preset)
    return model, tokenizer


def prompt_format_of(settings: Settings) -> PromptFormat:
    """The prompt format the configured objective trains."""
    return "sequence" if settings.sft.objective == "sequence" else "text"


def check_window(settings: Settings, levels: int) -> None:
    """A sequence window must fit the context: BOS, then L SID tokens and EOS per item."""
    cfg = settings.sft
    tokens = cfg.window * (levels + 1) + 1
    if cfg.objective == "sequence" and tokens > settings.model.max_length:
        fits = (settings.model.max_length - 1) // (levels + 1)
        raise ConfigError(
            f"sft.window={cfg.window} items of {levels} SID tokens + EOS take {tokens} tokens, "
            f"more than model.max_length={settings.model.max_length}; set sft.window <= {fits} "
            "or raise model.max_length"
        )


def build_datasets(
    settings: Settings, builder: PromptBuilder, train: pd.DataFrame, valid: pd.DataFrame
) -> tuple[list[Example], list[Example]]:
    cfg = settings.sft
    rows = recent_rows(without_recent_rows(train, cfg.holdout_recent), cfg.max_rows_per_user)
    examples: list[Example] = []
    for task_name in cfg.tasks:
        if task_name == "seq_rec" and cfg.objective == "sequence":
            examples += [builder.sequence_example(w) for w in sft_windows(settings, train)]
        elif task_name in ("seq_rec", "title_history"):
            by_title = task_name == "title_history"
            examples += [
                builder.history_example(list(h), t, by_title)
                for h, t in zip(rows["history"], rows["target"], strict=True)
            ]
        else:
            examples += builder.alignment_examples(task_name)
    # checkpoint selection reads the selection half only: the gate half judges promotion
    eval_rows = validation_half(valid, "selection").head(cfg.eval_rows)
    evals = [
        builder.history_example(list(h), t, False)
        for h, t in zip(eval_rows["history"], eval_rows["target"], strict=True)
    ]
    return examples, evals


def window_augmentations(settings: Settings, tokenizer: Any, sid_map: SidMap) -> list[Any]:
    """The batch augmentations ``sft.corrupt_items`` / ``sft.drop_items`` switch on (sequence
    objective only: the rows objective has no windows to touch)."""
    from models.sft_trainer import ItemCorruption, ItemDeletion

    cfg = settings.sft
    if cfg.objective != "sequence" or (cfg.corrupt_items == 0 and cfg.drop_items == 0):
        return []
    item_tokens = sid_token_matrix(tokenizer, sid_map, list(sid_map))
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    augment: list[Any] = []
    if cfg.corrupt_items > 0:
        augment.append(ItemCorruption(item_tokens, share=cfg.corrupt_items, bos_token_id=bos))
    if cfg.drop_items > 0:
        augment.append(
            ItemDeletion(
                item_tokens,
                share=cfg.drop_items,
                bos_token_id=bos,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        )
    return augment


def sft(settings: Settings) -> StageResult:
    """Fine-tune a model on the configured objective, keep its best validation, write its metrics."""
    from models.sft_trainer import SidSFTTrainer
    from models.weight_average import with_average

    paths, cfg = settings.paths, settings.sft
    items, sid_map = load_catalog_and_map(settings)
    train, valid = read_split(settings, "train"), read_split(settings, "valid")
    levels, k = sid_shape(sid_map, settings.sids.codebook_size)
    check_window(settings, levels)
    check_teacher_ease(settings, len(items))  # GRPO's anchor too: refused before SFT trains
    texts = item_texts(settings, items)  # a bad sft.item_text stops the stage before training
    warm = _champion_model(settings, levels, k)
    model, tokenizer = warm or build_model_and_tokenizer(settings, list(texts.values()), levels, k)
    set_prompt_format(model, prompt_format_of(settings))  # saved with the model
    builder = PromptBuilder(
        tokenizer=tokenizer,
        sid_map=sid_map,
        titles=texts,
        max_length=settings.model.max_length,
        fmt=prompt_format_of(settings),
    )
    examples, evals = build_datasets(settings, builder, train, valid)
    _log_cut_prompts(builder)
    check_enough(  # one for each process
        len(examples),
        world_size(),
        "training examples",
        "launch fewer processes (orchestration.num_processes, accelerate's --num_processes)",
    )
    paths.sft_dir.mkdir(parents=True, exist_ok=True)
    args = _sft_arguments(settings)
    # the new SID rows must learn: SFT trains the embeddings and output layer in full
    peft_config = lora_config(settings, modules_to_save=["embed_tokens", "lm_head"])
    recommender = SidRecommender(
        model=model,
        tokenizer=tokenizer,
        sid_map=sid_map,
        item_ids=items["item_id"].tolist(),
        **recommender_options(settings),
    )
    validation = ValidationSample(settings, recommender, train, valid, users=cfg.eval_users)
    best_dir = paths.sft_dir / ".best"
    validator = _validator(settings, validation, tokenizer, best_dir, warm=warm is not None)
    augment = window_augmentations(settings, tokenizer, sid_map)
    teacher = sasrec_teacher(settings, tokenizer, sid_map, items["item_id"].tolist())
    trainer = SidSFTTrainer(
        model=model,
        args=args,
        train_dataset=_dataset(examples),
        eval_dataset=_dataset(evals),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=with_average(validator, cfg.ema_decay, "sft.ema_decay"),
        augment=augment,
        teacher=teacher,
    )
    if hooked := add_residual_dropout(trainer.model, cfg.dropout):  # LoRA-wrapped where on
        log.info("residual dropout %.2f on %d modules while training", cfg.dropout, hooked)
    trained = _train(settings, trainer, validator, best_dir)
    if trained is None:  # it trained its shard; the main process writes
        return StageResult(stage="sft", outputs={})
    metrics = _sft_metrics(
        settings,
        trained,
        warm=warm is not None,
        augment=augment,
        examples=len(examples),
        evals=len(evals),
        builder=builder,
        parameters=int(sum(p.numel() for p in model.parameters())),
        valid_users=len(validation),
    )
    atomic_write_json(paths.metrics("sft"), metrics)
    return sft_result(settings, metrics)


def _champion_model(settings: Settings, levels: int, k: int) -> tuple[Any, Any] | None:
    """The registered champion's model and tokenizer, loaded into memory to continue training
    (``sft.warm_start: champion``), with the SID tokens its vocabulary lacks added; None when
    the setting is off or there is no champion."""
    if settings.sft.warm_start != "champion":
        return None
    with tempfile.TemporaryDirectory(prefix="sidrec-champion-") as download:
        start = champion_start(settings, Path(download), purpose="sft.warm_start")
        warm = load_model_dir(start) if start is not None else None  # loaded into memory
    if warm is None:
        return None
    model, tokenizer = warm
    if add_sid_tokens(tokenizer, levels, k):  # codes beyond the champion's vocabulary
        model.resize_token_embeddings(len(tokenizer))
    model.train()
    return model, tokenizer


def _log_cut_prompts(builder: PromptBuilder) -> None:
    """Say how many examples lost part of their text to ``model.max_length``."""
    if builder.truncated:
        log.warning(
            "%d prompt(s) were longer than model.max_length and lost their oldest items",
            builder.truncated,
        )
    if builder.texts_cut:
        log.warning(
            "%d alignment pair(s) had their item text (sft.item_text) cut to fit model.max_length",
            builder.texts_cut,
        )


def _sft_arguments(settings: Settings) -> Any:
    """TRL's ``SFTConfig`` for this stage: the shared trainer arguments plus SFT's schedule,
    batches and loss."""
    from trl import SFTConfig

    cfg = settings.sft
    return SFTConfig(
        **trainer_arguments(
            settings,
            "sft",
            num_train_epochs=cfg.epochs,
            per_device_train_batch_size=per_process(cfg.batch_size, "sft.batch_size"),
            per_device_eval_batch_size=per_process(cfg.batch_size, "sft.batch_size"),
            warmup_steps=cfg.warmup_ratio,  # a float < 1 is a fraction of the total steps
            lr_scheduler_type="cosine",  # over the planned epochs
            logging_steps=cfg.logging_steps,
            eval_strategy="epoch",
            save_strategy="no",  # the best model by validation NDCG@10 is kept instead
            max_length=settings.model.max_length,
            packing=cfg.packing,
            packing_strategy="bfd",  # whole examples only: a window is never cut
            completion_only_loss=True,
            label_smoothing_factor=cfg.label_smoothing,
        )
    )


def _dataset(examples: list[Example]) -> Any:
    """``examples`` as a Hugging Face dataset, one row per example."""
    from datasets import Dataset

    return Dataset.from_list([e._asdict() for e in examples])


def _validator(
    settings: Settings, validation: ValidationSample, tokenizer: Any, best_dir: Path, *, warm: bool
) -> Any:
    """The callback that validates every ``sft.eval_every`` epochs and keeps the best model in
    ``best_dir`` (emptied first); a warm start is validated before the first step, so it is kept
    when training does not beat it."""
    from models.validation import ValidationCallback

    if is_main_process():  # only the main process writes (sidrec/distributed.py)
        shutil.rmtree(best_dir, ignore_errors=True)
    cfg = settings.sft
    return ValidationCallback(
        evaluate=validation,
        save_best=lambda m: save_trained(m, tokenizer, best_dir),
        every=cfg.eval_every,
        unit="epoch",
        at_start=warm,
        patience=cfg.patience,
    )


class _Trained(NamedTuple):
    """What training left for the metrics (main process only)."""

    trainer: Any
    validator: Any
    result: Any  # transformers' TrainOutput
    eval_metrics: dict[str, float]  # of the last step's weights
    shards: list[dict[str, Any]]  # per process: rows trained on, a digest of its first batch


def _train(settings: Settings, trainer: Any, validator: Any, best_dir: Path) -> _Trained | None:
    """Train inside the stage's MLflow run and move the best model to ``artifacts/sft``; None on
    a process other than the main one. The main process removes ``best_dir`` whatever happens."""
    # TRL's MLflow callback logs into this stage's run (nested under the pipeline's run)
    run_params = {"sft": settings.section("sft"), "model": settings.section("model")}
    try:
        with training_run(dataset=settings.project.dataset, stage="sft", params=run_params):
            result = trainer.train()
            eval_metrics = trainer.evaluate()
        assert validator.best is not None, "training ends with a validation"
        shards = shard_records(trainer)
        if not is_main_process():
            return None
        replace_dir(best_dir, settings.paths.sft_model)
    finally:
        if is_main_process():
            shutil.rmtree(best_dir, ignore_errors=True)
    return _Trained(trainer, validator, result, eval_metrics, shards)


def _sft_metrics(
    settings: Settings,
    trained: _Trained,
    *,
    warm: bool,
    augment: list[Any],
    examples: int,
    evals: int,
    builder: PromptBuilder,
    parameters: int,
    valid_users: int,
) -> dict[str, Any]:
    """``metrics/sft.json``: the settings the run trained with, what the trainer actually applied,
    the data, the losses and the validations."""
    from models.weight_average import decay_for

    cfg, (trainer, validator, result, eval_metrics, shards) = settings.sft, trained
    best = validator.best
    return {
        "dataset": settings.project.dataset,
        "model": settings.model.preset,  # model.preset (tiny, smollm2-135m, hf)
        "project_preset": settings.project.preset,  # default or quality
        "warm_start": champion_label(settings) if warm else None,
        "objective": cfg.objective,
        "window": cfg.window if cfg.objective == "sequence" else None,
        "tasks": list(cfg.tasks),
        "dropout": cfg.dropout,
        "corrupt_items": cfg.corrupt_items,
        "drop_items": cfg.drop_items,
        "label_smoothing": cfg.label_smoothing,
        "distill": cfg.distill,
        "distill_temperature": cfg.distill_temperature if cfg.distill > 0 else None,
        # what the trainer actually ran with: the batch augmentations it applied, and the
        # teacher's loss term as last logged (None: no teacher term reached the loss)
        "augmentations": [type(a).__name__ for a in augment],
        "distill_loss_last": next(
            (
                round(float(e["distill_loss"]), 5)
                for e in reversed(trainer.state.log_history)
                if "distill_loss" in e
            ),
            None,
        ),
        "holdout_recent": cfg.holdout_recent,
        "ema_decay": cfg.ema_decay,
        # what the run averaged with: a run shorter than 2 / (1 - decay) steps uses less
        "ema_decay_applied": (
            None if cfg.ema_decay is None else decay_for(cfg.ema_decay, trainer.state.max_steps)
        ),
        "train_examples": examples,
        "eval_examples": evals,
        "truncated_prompts": builder.truncated,
        "item_texts_cut": builder.texts_cut,
        "parameters": parameters,
        "train_loss": round(float(result.training_loss), 5),
        # of the last step's weights: the kept model is the best validation's (or its average)
        "eval_loss_last_step": round(float(eval_metrics["eval_loss"]), 5),
        "steps": int(result.global_step),
        "epochs_run": round(float(trainer.state.epoch or 0), 3),
        "stopped_early": validator.stopped_early,
        "train_seconds": round(float(result.metrics["train_runtime"]), 1),
        "processes": len(shards),
        "shards": shards,  # per process: rows trained on, a digest of its first batch
        "valid_users": valid_users,
        "valid_num_beams": settings.evaluate.num_beams,
        "best_epoch": best.get("epoch", 0.0),
        "valid_best": {k: round(v, 5) for k, v in best.items() if "@" in k},
        "valid_history": [{k: round(v, 5) for k, v in r.items()} for r in validator.history],
    }


def sft_result(settings: Settings, metrics: dict[str, Any]) -> StageResult:
    """The stage's result from its metrics (also read back after a launched run)."""
    m, paths = metrics, settings.paths
    summary = (
        f"{m['objective']}: {m['train_examples']:,} examples · {m['steps']} steps · "
        f"best epoch {m['best_epoch']:g} of {m['epochs_run']:g} · valid NDCG@10 "
        f"{m['valid_best']['ndcg@10']:.4f}"
    )
    if m.get("processes", 1) > 1:
        summary += f" · {m['processes']} processes"
    files = [paths.sft_model / "config.json", paths.metrics("sft")]
    return StageResult.from_files("sft", files, metrics, summary)


@task(name="sft", cache_policy=StageCache(stage="sft"), persist_result=True)
def sft_task(settings: Settings) -> StageResult:
    if settings.orchestration.accelerate_config is not None:  # N processes (one per GPU)
        result = sft_result(settings, run_launched(settings, "sft"))
    else:
        result = sft(settings)
    m = result.metrics
    stats: tuple[str, ...] = (
        "model",
        "project_preset",
        "objective",
        "train_examples",
        "parameters",
        "train_loss",
        "eval_loss_last_step",
    )
    stats += ("steps", "best_epoch", "epochs_run")
    publish_stats(
        "sft",
        m["dataset"],
        {k: m[k] for k in (*stats, "train_seconds")},
        description="Supervised fine-tuning",
    )
    return result
