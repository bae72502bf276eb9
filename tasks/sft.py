"""Stage 6 — sft: teach a language model to generate the next item's SID (TRL's SFTTrainer).

Writes ``artifacts/sft/<ds>/model`` (model + tokenizer with SID tokens, loads with
``from_pretrained``) and ``metrics/sft.json``. Loss on the completion only.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task

from models.lm import (
    add_sid_tokens,
    build_tiny,
    load_model_dir,
    load_pretrained,
    save_model_dir,
    train_tokenizer,
)
from models.prompts import (
    Example,
    PromptBuilder,
    seq_rec_prompt,
    sid2title_prompt,
    title2sid_prompt,
    title_history_prompt,
)
from models.sid import SidMap
from sidrec.config import Settings
from sidrec.io import atomic_write_json
from sidrec.orchestration import StageCache, publish_stats
from sidrec.protocol import validation_half
from sidrec.registry import champion_label, champion_start
from sidrec.stage import StageResult
from sidrec.tracking import stage_run
from tasks.shared.inputs import load_catalog_and_map, read_split, recent_rows
from tasks.shared.training import lora_config, trainer_arguments

log = logging.getLogger(__name__)


def sid_shape(sid_map: SidMap, codebook_size: int) -> tuple[int, int]:
    """(levels, codes per level) the vocabulary must cover."""
    levels = len(next(iter(sid_map.values())))
    top = max(max(codes) for codes in sid_map.values()) + 1
    return levels, max(codebook_size, top)


def build_model_and_tokenizer(
    settings: Settings, items: pd.DataFrame, levels: int, k: int
) -> tuple[Any, Any]:
    cfg = settings.model
    if cfg.preset == "tiny":
        titles = items["title"].astype(str).tolist()
        corpus = (
            titles
            + [
                seq_rec_prompt([]),
                title_history_prompt(titles[:3]),
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
        )
        return model, tokenizer
    model, tokenizer = load_pretrained(cfg.preset, cfg.name_or_path)
    added = add_sid_tokens(tokenizer, levels, k)
    model.resize_token_embeddings(len(tokenizer))
    log.info("added %d SID tokens to %s", added, cfg.preset)
    return model, tokenizer


def build_datasets(
    settings: Settings, builder: PromptBuilder, train: pd.DataFrame, valid: pd.DataFrame
) -> tuple[list[Example], list[Example]]:
    cfg = settings.sft
    rows = recent_rows(train, cfg.max_rows_per_user)
    examples: list[Example] = []
    for task_name in cfg.tasks:
        if task_name in ("seq_rec", "title_history"):
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


def sft(settings: Settings) -> StageResult:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    paths, cfg = settings.paths, settings.sft
    items, sid_map = load_catalog_and_map(settings)
    train, valid = read_split(settings, "train"), read_split(settings, "valid")
    levels, k = sid_shape(sid_map, settings.sids.codebook_size)
    warm = None
    if cfg.warm_start == "champion":
        with tempfile.TemporaryDirectory(prefix="sidrec-champion-") as download:
            start = champion_start(settings, Path(download), purpose="sft.warm_start")
            warm = load_model_dir(start) if start is not None else None  # loaded into memory
    if warm is not None:
        model, tokenizer = warm
        if add_sid_tokens(tokenizer, levels, k):  # codes beyond the champion's vocabulary
            model.resize_token_embeddings(len(tokenizer))
        model.train()
    else:
        model, tokenizer = build_model_and_tokenizer(settings, items, levels, k)
    titles = dict(zip(items["item_id"], items["title"].astype(str), strict=True))
    builder = PromptBuilder(
        tokenizer=tokenizer, sid_map=sid_map, titles=titles, max_length=settings.model.max_length
    )
    examples, evals = build_datasets(settings, builder, train, valid)
    if builder.truncated:
        log.warning(
            "%d prompt(s) were longer than model.max_length and lost their oldest items",
            builder.truncated,
        )

    paths.sft_dir.mkdir(parents=True, exist_ok=True)
    args = SFTConfig(
        **trainer_arguments(
            settings,
            "sft",
            num_train_epochs=cfg.epochs,
            per_device_train_batch_size=cfg.batch_size,
            per_device_eval_batch_size=cfg.batch_size,
            warmup_steps=cfg.warmup_ratio,  # a float < 1 is a fraction of the total steps
            lr_scheduler_type="cosine",
            logging_steps=cfg.logging_steps,
            eval_strategy="epoch",
            save_strategy="epoch",
            save_total_limit=1,
            max_length=settings.model.max_length,
            completion_only_loss=True,
        )
    )
    # the new SID rows must learn: SFT trains the embeddings and output layer in full
    peft_config = lora_config(settings, modules_to_save=["embed_tokens", "lm_head"])
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([e._asdict() for e in examples]),
        eval_dataset=Dataset.from_list([e._asdict() for e in evals]),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    # TRL's MLflow callback logs into this stage's run (nested under the pipeline's run)
    run_params = {"sft": settings.section("sft"), "model": settings.section("model")}
    with stage_run(dataset=settings.project.dataset, stage="sft", params=run_params):
        result = trainer.train()
        eval_metrics = trainer.evaluate()
    save_model_dir(trainer.model, tokenizer, paths.sft_model)
    metrics = {
        "dataset": settings.project.dataset,
        "preset": settings.model.preset,
        "warm_start": champion_label(settings) if warm is not None else None,
        "tasks": list(cfg.tasks),
        "train_examples": len(examples),
        "eval_examples": len(evals),
        "truncated_prompts": builder.truncated,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "train_loss": round(float(result.training_loss), 5),
        "eval_loss": round(float(eval_metrics["eval_loss"]), 5),
        "steps": int(result.global_step),
        "train_seconds": round(float(result.metrics["train_runtime"]), 1),
    }
    atomic_write_json(paths.metrics("sft"), metrics)
    summary = (
        f"{metrics['train_examples']:,} examples · {metrics['steps']} steps · "
        f"eval loss {metrics['eval_loss']:.3f}"
    )
    files = [paths.sft_model / "config.json", paths.metrics("sft")]
    return StageResult.from_files("sft", files, metrics, summary)


@task(name="sft", cache_policy=StageCache(stage="sft"), persist_result=True)
def sft_task(settings: Settings) -> StageResult:
    result = sft(settings)
    m = result.metrics
    stats = ("preset", "train_examples", "parameters", "train_loss", "eval_loss", "steps")
    publish_stats(
        "sft",
        m["dataset"],
        {k: m[k] for k in (*stats, "train_seconds")},
        description="Supervised fine-tuning",
    )
    return result
