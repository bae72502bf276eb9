"""Stage 7 — grpo: reinforcement learning of the SFT model with TRL's GRPOTrainer.

Rollouts are constrained to catalog SIDs (:mod:`models.grpo_trainer`), rewarded by the
functions in :mod:`models.rewards`, and the model is scored on a fixed validation sample
every ``grpo.eval_every`` steps; the best one by validation NDCG@10 (the SFT starting point
included) is written to ``artifacts/grpo/<ds>/model``. Metrics: ``metrics/grpo.json``.

Runs unchanged as several processes (``accelerate launch -m sidrec grpo``): each rolls out and
trains on its share of every step's ``grpo.prompts_per_step`` prompts (whole groups), the main
process writes the model, the metrics and the MLflow run (``tasks/shared/training.py``).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from prefect import task

from models.baselines import catalog_index, encode_histories, encode_targets
from models.baselines.ease import EASE
from models.baselines.ease import MAX_ITEMS as EASE_MAX_ITEMS
from models.baselines.sasrec import SASRec
from models.constrained import sid_regex
from models.grpo_callbacks import SampleSink
from models.lm import replace_dir
from models.prompts import PromptBuilder
from models.rewards import (
    DENSE_REWARDS,
    NO_TARGET,
    CollaborativeReward,
    EaseReward,
    GroupRank,
    NonFiniteGuard,
    RewardFunc,
    SemanticReward,
    ranking_reward,
    rule_reward,
)
from models.sft_anchor import SftAnchor
from models.sid import SidMap, sid_string
from sidrec.config import Settings
from sidrec.distributed import is_main_process, process_rank
from sidrec.errors import ConfigError
from sidrec.io import atomic_write_json
from sidrec.orchestration import StageCache, publish_stats, publish_table
from sidrec.protocol import items_after, items_before, seen_items
from sidrec.stage import StageResult
from sidrec.tracking import training_run
from tasks.shared.embeddings import load_embeddings
from tasks.shared.inputs import (
    check_teacher_ease,
    item_texts,
    load_catalog_and_map,
    load_recommender,
    read_split,
    recent_rows,
    sasrec_loader,
    sasrec_teacher,
    sft_windows,
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


def check_grpo_config(settings: Settings, n_items: int) -> None:
    """Configuration errors that must stop the stage before any model is loaded."""
    from models.grpo_config import check_ensure_target, check_group_size, check_vllm

    cfg = settings.grpo
    try:
        check_group_size(cfg.num_generations, n_items)
        check_vllm(use_vllm=cfg.use_vllm, rollout=cfg.rollout)
        check_ensure_target(ensure_target=cfg.ensure_target, rollout=cfg.rollout)
    except ValueError as exc:
        raise ConfigError(f"grpo.{exc}") from None
    if cfg.rows_per_user == 0 and not cfg.frontier_prompts:
        raise ConfigError(
            "grpo.rows_per_user is 0 and grpo.frontier_prompts is false: no training prompts; "
            "set grpo.rows_per_user >= 1 (or null for all rows) or grpo.frontier_prompts true"
        )
    if cfg.frontier_prompts and cfg.rewards.collaborative <= 0:
        raise ConfigError(
            "grpo.frontier_prompts is true but grpo.rewards.collaborative is 0: a frontier prompt "
            "has no target, so only the collaborative reward can score its group; set "
            "grpo.rewards.collaborative > 0 or grpo.frontier_prompts false"
        )
    if cfg.rewards.ease > 0 and n_items > EASE_MAX_ITEMS:
        raise ConfigError(
            f"grpo.rewards.ease is {cfg.rewards.ease} but the catalog has {n_items} items: EASE "
            f"inverts a dense items × items matrix, up to {EASE_MAX_ITEMS} items; set "
            "grpo.rewards.ease: 0"
        )
    check_teacher_ease(settings, n_items)


def training_rows(
    settings: Settings, builder: PromptBuilder, train: pd.DataFrame, index: dict[str, int]
) -> list[dict[str, Any]]:
    """One row per training prompt, with its own target (never looked up by prompt text) and,
    under ``evaluate.exclude_seen``, the items the user had before it (``exclude_index``): the
    rollout then ranks as evaluation does, so no group spends a place on an item evaluation
    would never recommend."""
    per_user = settings.grpo.rows_per_user
    rows = recent_rows(train, per_user) if per_user != 0 else train.iloc[:0]
    histories = [list(h) for h in rows["history"]]
    targets = encode_targets(list(rows["target"]), index, "train targets")
    encoded = encode_histories(histories, index, "train histories")
    out: list[dict[str, Any]] = [
        {
            "prompt": builder.history_prompt(h),
            "target_index": int(t),
            "history_index": e,
        }
        for h, t, e in zip(histories, targets, encoded, strict=True)
    ]
    if settings.evaluate.exclude_seen:
        seen = encode_histories(items_before(train, rows), index, "train histories")
        for row, items in zip(out, seen, strict=True):
            row["exclude_index"] = items
    if settings.grpo.frontier_prompts:
        out += frontier_rows(
            builder, train, index, settings.split.max_history, settings.evaluate.exclude_seen
        )
    share = settings.grpo.title_prompts
    if share > 0:
        if "title2sid" not in settings.sft.tasks:
            log.warning(
                "grpo.title_prompts=%s but sft.tasks has no title2sid: the SFT model never saw "
                "the title prompt",
                share,
            )
        count = round(share * len(out) / (1 - share))
        out += title_rows(
            builder, index, count, settings.project.seed, settings.evaluate.exclude_seen
        )
    horizon = settings.grpo.horizon
    if horizon > 1:  # what the rewards count as right (models/rewards.py: hits)
        after = encode_histories(items_after(train, rows, horizon), index, "train targets")
        for n, row in enumerate(out):  # frontier and title prompts: their own target alone
            target = row["target_index"]
            row["positive_index"] = (
                after[n] if n < len(after) else [target] if target != NO_TARGET else []
            )
    return out


def frontier_rows(
    builder: PromptBuilder,
    train: pd.DataFrame,
    index: dict[str, int],
    max_history: int,
    exclude_seen: bool,
) -> list[dict[str, Any]]:
    """One prompt per user (``grpo.frontier_prompts``): the user's newest train row's history
    and target, the newest ``max_history`` of them, as the history; target ``NO_TARGET`` (what
    comes next is the valid split's). Under ``exclude_seen`` the rollout leaves out every train
    item of the user, as evaluation of the valid rows does."""
    last = recent_rows(train, 1)
    histories = [
        [*h, t][-max_history:] for h, t in zip(last["history"], last["target"], strict=True)
    ]
    encoded = encode_histories(histories, index, "train histories")
    rows: list[dict[str, Any]] = [
        {"prompt": builder.history_prompt(h), "target_index": NO_TARGET, "history_index": e}
        for h, e in zip(histories, encoded, strict=True)
    ]
    if exclude_seen:  # every train item of the user: what evaluation excludes for valid rows
        seen = encode_histories(seen_items(train, last), index, "train histories")
        for row, items in zip(rows, seen, strict=True):
            row["exclude_index"] = items
    return rows


def title_rows(
    builder: PromptBuilder, index: dict[str, int], count: int, seed: int, exclude_seen: bool
) -> list[dict[str, Any]]:
    """``count`` title→SID prompts (``grpo.title_prompts``): the catalog's items in a seeded
    random order, repeated as often as ``count`` needs, each prompt its own item's target. They
    carry no history (the collaborative reward leaves them out) and exclude nothing."""
    items = list(builder.titles)
    rng = np.random.default_rng(seed)
    rounds = -(-count // len(items)) if items else 0
    order = [i for _ in range(rounds) for i in rng.permutation(len(items))][:count]
    rows: list[dict[str, Any]] = []
    for i in order:
        item = items[i]
        row: dict[str, Any] = {
            "prompt": builder.title_prompt(item),
            "target_index": index[item],
            "history_index": [],
        }
        if exclude_seen:
            row["exclude_index"] = []
        rows.append(row)
    return rows


def reward_functions(
    settings: Settings, item_ids: list[str], sasrec: Callable[[], SASRec] | None = None
) -> tuple[list[NonFiniteGuard], list[float]]:
    """The rewards with a weight > 0 (each NaN-guarded; the dense ones ranked within their group
    under ``grpo.reward_form: rank``) and their weights; the collaborative one scores with
    ``sasrec`` (a shared :func:`~tasks.shared.inputs.sasrec_loader`) when given."""
    weights = settings.grpo.rewards
    g = settings.grpo.num_generations
    builders: dict[str, Callable[[], RewardFunc]] = {
        "rule": lambda: rule_reward,
        "ranking": lambda: partial(ranking_reward, num_generations=g),
        "collaborative": lambda: _collaborative(sasrec or sasrec_loader(settings, item_ids)),
        "ease": lambda: _ease(settings, item_ids),
        "semantic": lambda: SemanticReward(embeddings=load_embeddings(settings, item_ids)),
    }
    funcs, used = [], []
    for name, build in builders.items():
        weight = getattr(weights, name)
        if weight > 0:
            func = build()
            if name in DENSE_REWARDS and settings.grpo.reward_form == "rank":
                func = GroupRank(func, g)
            funcs.append(NonFiniteGuard(func, name))
            used.append(float(weight))
    return funcs, used


def _collaborative(sasrec: Callable[[], SASRec]) -> CollaborativeReward:
    """The reward from the SASRec model the ``baselines`` stage trained (read, not retrained)."""
    model = sasrec()
    return CollaborativeReward(model=model, max_len=model.config.max_len)


def _ease(settings: Settings, item_ids: list[str]) -> EaseReward:
    """The EASE reward, its model fitted here on the train split (a dense closed form, no
    training loop)."""
    cfg = settings.grpo
    model = EASE(item_ids=item_ids, l2=cfg.ease_l2, recency=cfg.ease_recency)
    return EaseReward(model=model.fit(read_split(settings, "train")))


def grpo(settings: Settings, on_samples: SampleSink | None = None) -> StageResult:
    """Train the SFT model further with GRPO; ``on_samples(step, rows)`` receives each sample table."""
    from datasets import Dataset

    from models.grpo_callbacks import SampleTables
    from models.grpo_trainer import SidGRPOTrainer
    from models.weight_average import with_average

    cfg, paths = settings.grpo, settings.paths
    _check_enabled(settings)
    items, sid_map = load_catalog_and_map(settings)
    item_ids = items["item_id"].tolist()
    check_grpo_config(settings, len(item_ids))
    train, valid = read_split(settings, "train"), read_split(settings, "valid")
    hint = "run `sidrec sft` first"
    recommender = load_recommender(settings, paths.sft_model, sid_map, item_ids, missing_hint=hint)
    model, tokenizer, trie = recommender.model, recommender.tokenizer, recommender.trie
    builder = PromptBuilder(
        tokenizer=tokenizer,
        sid_map=sid_map,
        titles=item_texts(settings, items),  # title prompts read the texts SFT aligned
        max_length=settings.model.max_length,
        fmt=recommender.prompts.format,  # as the SFT model was trained
    )
    index = catalog_index(item_ids)
    rows = training_rows(settings, builder, train, index)
    validation = ValidationSample(settings, recommender, train, valid, users=cfg.eval_users)
    sasrec = sasrec_loader(settings, item_ids)  # one copy for the reward and the anchor's teacher
    rewards, weights = reward_functions(settings, item_ids, sasrec)
    check_enough(  # one step's prompts
        len(rows),
        cfg.prompts_per_step,
        "training prompts",
        "lower grpo.prompts_per_step, or add prompts (grpo.rows_per_user: null takes every "
        "train row; grpo.frontier_prompts, grpo.title_prompts)",
    )
    args = _grpo_arguments(settings, weights, trie.levels, sid_map, item_ids)
    best_dir = paths.grpo_dir / ".best"
    validator = _validator(settings, validation, tokenizer, best_dir)
    samples = SampleTables(
        every=cfg.log_samples_every,
        groups=cfg.sample_rows,
        num_generations=cfg.num_generations,
        titles=items["title"].astype(str).tolist(),  # readable samples: the titles alone
        sink=on_samples,
    )
    trainer = SidGRPOTrainer(
        model=model,
        trie=trie,
        args=args,
        reward_funcs=list(rewards),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        # LoRA: the adapters alone learn; the SID rows SFT trained in full stay as they are, and
        # the adapter-disabled model (the KL reference) is exactly the SFT model
        peft_config=lora_config(settings),
        callbacks=with_average(validator, cfg.ema_decay, "grpo.ema_decay"),
        on_rewards=samples,
        anchor=sft_anchor(settings, builder, tokenizer, train, sid_map, item_ids, sasrec),
    )
    trained = _train(settings, trainer, validator, best_dir)
    if trained is None:  # it trained its shard; the main process writes
        return StageResult(stage="grpo", outputs={})
    metrics = _grpo_metrics(
        settings, trained, rewards, builder, n_rows=len(rows), valid_users=len(validation)
    )
    atomic_write_json(paths.metrics("grpo"), metrics)
    return grpo_result(settings, metrics)


def _check_enabled(settings: Settings) -> None:
    """A switched-off stage refuses to run, saying what DVC needs instead."""
    if not settings.grpo.enabled:
        raise ConfigError(
            "grpo.enabled is false: the grpo stage is switched off in params.yaml. "
            "`sidrec pipeline` skips it; `dvc repro` cannot (evaluate and register read the "
            "stage's model): set grpo.enabled: true for DVC, or run `sidrec pipeline`"
        )


def _grpo_arguments(
    settings: Settings, weights: list[float], levels: int, sid_map: SidMap, item_ids: list[str]
) -> Any:
    """``SidGRPOConfig`` for this stage: the shared trainer arguments plus GRPO's rollouts, loss
    and schedule; TRL's own refusals become a :class:`ConfigError`."""
    from models.grpo_config import SidGRPOConfig

    cfg = settings.grpo
    prompts_per_process = per_process(cfg.prompts_per_step, "grpo.prompts_per_step")
    try:
        return SidGRPOConfig(
            **trainer_arguments(
                settings,
                "grpo",
                rollout=cfg.rollout,
                oversample=cfg.oversample,
                ensure_target=cfg.ensure_target,
                trie_mask=cfg.trie_mask,
                positive_only=cfg.positive_only,
                num_generations=cfg.num_generations,
                # whole groups on every process (models/grpo_trainer.py)
                per_device_train_batch_size=prompts_per_process * cfg.num_generations,
                gradient_accumulation_steps=1,
                max_completion_length=levels + 1,  # L SID tokens + EOS (dr_grpo divides by it)
                max_steps=cfg.max_steps,
                lr_scheduler_type=cfg.lr_scheduler,
                warmup_steps=cfg.warmup_ratio,  # a float < 1 is a fraction of the steps
                max_grad_norm=cfg.max_grad_norm,
                beta=cfg.beta,
                loss_type=cfg.loss_type,
                importance_sampling_level=cfg.importance_sampling_level,
                num_iterations=cfg.num_iterations,
                epsilon=cfg.epsilon,
                epsilon_high=cfg.epsilon_high,
                scale_rewards=cfg.scale_rewards,
                reward_weights=weights,
                temperature=cfg.temperature,
                use_vllm=cfg.use_vllm,
                vllm_mode="colocate",
                vllm_structured_outputs_regex=(
                    sid_regex([sid_string(sid_map[i]) for i in item_ids]) if cfg.use_vllm else None
                ),
                logging_steps=max(1, min(10, cfg.max_steps // 10)),
                save_strategy="no",  # the best model by validation NDCG@10 is kept instead
                remove_unused_columns=False,  # target_index / history_index reach the rewards
            )
        )
    except ValueError as exc:
        raise ConfigError(f"grpo: {exc}") from None


def _validator(
    settings: Settings, validation: ValidationSample, tokenizer: Any, best_dir: Path
) -> Any:
    """The callback that validates every ``grpo.eval_every`` steps (the SFT start included) and
    keeps the best model in ``best_dir`` (emptied first)."""
    from models.validation import ValidationCallback

    if is_main_process():  # only the main process writes (sidrec/distributed.py)
        shutil.rmtree(best_dir, ignore_errors=True)
    return ValidationCallback(
        evaluate=validation,
        save_best=lambda m: save_trained(m, tokenizer, best_dir),
        every=settings.grpo.eval_every,
    )


class _Trained(NamedTuple):
    """What training left for the metrics (main process only)."""

    trainer: Any
    validator: Any
    result: Any  # transformers' TrainOutput
    seconds: float  # of trainer.train(), validations included
    shards: list[dict[str, Any]]  # per process: prompts trained on, a digest of its first batch


def _train(settings: Settings, trainer: Any, validator: Any, best_dir: Path) -> _Trained | None:
    """Train inside the stage's MLflow run and move the best model, with its step, to
    ``artifacts/grpo``; None on a process other than the main one. A failed or interrupted run
    leaves no copy of its best model behind."""
    paths = settings.paths
    started = time.perf_counter()
    # TRL's MLflow callback, the validation metrics and the sample tables log into this run
    run_params = {"grpo": settings.section("grpo"), "model": settings.section("model")}
    try:
        with training_run(dataset=settings.project.dataset, stage="grpo", params=run_params):
            result = trainer.train()
        seconds = time.perf_counter() - started
        assert validator.best is not None, "validation runs before the first step"
        shards = shard_records(trainer)
        if not is_main_process():
            return None
        # the kept step moves with the weights (evaluate's pick of the best generative model)
        kept = {"best_step": int(validator.best["step"])}
        atomic_write_json(best_dir / paths.grpo_kept_step.name, kept)
        replace_dir(best_dir, paths.grpo_model)
    finally:
        if is_main_process():
            shutil.rmtree(best_dir, ignore_errors=True)
    return _Trained(trainer, validator, result, seconds, shards)


def sft_anchor(
    settings: Settings,
    builder: PromptBuilder,
    tokenizer: Any,
    train: pd.DataFrame,
    sid_map: SidMap,
    item_ids: list[str],
    sasrec: Callable[[], SASRec] | None = None,
) -> SftAnchor | None:
    """SFT's own sequence windows (the train split less ``sft.holdout_recent`` rows per user) as
    GRPO's anchor (``grpo.sft_anchor``; None when off), scored with SFT's loss: its SASRec
    teacher joins where ``sft.distill`` is on, EASE blended in at ``grpo.anchor_ease`` (null:
    ``sft.distill_ease``). Under ``accelerate launch`` every process draws
    its own windows."""
    cfg = settings.grpo
    if cfg.sft_anchor <= 0:
        return None
    return SftAnchor(
        [builder.sequence_example(w) for w in sft_windows(settings, train)],
        tokenizer,
        weight=cfg.sft_anchor,
        per_step=cfg.anchor_windows,
        seed=settings.project.seed + process_rank(),
        teacher=sasrec_teacher(
            settings, tokenizer, sid_map, item_ids, sasrec, ease_weight=cfg.anchor_ease
        ),
    )


def grpo_result(settings: Settings, metrics: dict[str, Any]) -> StageResult:
    """The stage's result from its metrics (also read back after a launched run)."""
    m, paths = metrics, settings.paths
    start, best = m["valid_start"]["ndcg@10"], m["valid_best"]["ndcg@10"]
    summary = (
        f"{m['steps']} steps · {m['rollout']} rollouts x {m['num_generations']} · "
        f"valid NDCG@10 {start:.4f} → {best:.4f} (step {m['best_step']})"
    )
    if m.get("processes", 1) > 1:
        summary += f" · {m['processes']} processes"
    files = [paths.grpo_model / "config.json", paths.metrics("grpo")]
    return StageResult.from_files("grpo", files, metrics, summary)


def _grpo_metrics(
    settings: Settings,
    trained: _Trained,
    rewards: list[NonFiniteGuard],
    builder: PromptBuilder,
    *,
    n_rows: int,
    valid_users: int,
) -> dict[str, Any]:
    """``metrics/grpo.json``: the rollout and loss settings, the rewards and their weights, the
    rollouts step by step, the validations and what each process trained on."""
    cfg, (trainer, validator, result, seconds, shards) = settings.grpo, trained
    logs = [e for e in trainer.state.log_history if "reward" in e]

    def mean_of(key: str) -> float | None:
        values = [e[key] for e in logs if key in e]
        return round(float(np.mean(values)), 5) if values else None

    start, best = validator.history[0], validator.best
    return {
        "dataset": settings.project.dataset,
        "rollout": cfg.rollout,
        "num_generations": cfg.num_generations,
        "prompts_per_step": cfg.prompts_per_step,
        "loss_type": cfg.loss_type,
        "rewards": {
            f.__name__: w for f, w in zip(rewards, trainer.reward_weights.tolist(), strict=True)
        },
        "train_prompts": n_rows,
        "steps": int(result.global_step),
        "train_seconds": round(seconds, 1),
        "seconds_per_step": round(seconds / max(1, result.global_step), 3),
        "reward_first": logs[0]["reward"] if logs else None,
        "reward_last": logs[-1]["reward"] if logs else None,
        "distinct_items_per_group": mean_of("rollout/distinct_items"),
        "target_in_group": mean_of("rollout/target_in_group"),
        "rollout_history": [rollout_log(e) for e in logs],
        "step_times": [round(float(e["step_time"]), 4) for e in logs if "step_time" in e],
        "non_finite_rewards": int(sum(f.count for f in rewards)),
        "valid_start": {k: round(v, 5) for k, v in start.items() if k != "step"},
        "valid_best": {k: round(v, 5) for k, v in best.items() if k != "step"},
        "best_step": int(best["step"]),
        "valid_history": [{k: round(v, 5) for k, v in r.items()} for r in validator.history],
        "prompts_truncated": builder.truncated,  # histories that lost their oldest items
        "title_texts_cut": builder.texts_cut,  # title prompts cut to fit the SID's room
        "valid_users": valid_users,
        "valid_num_beams": settings.evaluate.num_beams,
        "processes": len(shards),
        "shards": shards,  # per process: prompts trained on, a digest of its first batch
    }


def rollout_log(entry: dict[str, Any]) -> dict[str, Any]:
    """One logging step of TRL's log history: the share of groups holding their target (before
    ``ensure_target`` inserts it), its mean place where held, and each reward's mean."""
    keys = ("rollout/target_in_group", "rollout/target_rank")
    row: dict[str, Any] = {"step": int(entry["step"])}
    row |= {k.split("/")[1]: round(float(entry[k]), 5) for k in keys if k in entry}
    row |= {  # a reward that scored no completion of the step (e.g. only frontier prompts): None
        k: round(float(v), 5) if v is not None else None
        for k, v in entry.items()
        if k.startswith("rewards/") and k.endswith("/mean")
    }
    return row


@task(name="grpo", cache_policy=StageCache(stage="grpo"), persist_result=True)
def grpo_task(settings: Settings) -> StageResult:
    dataset = settings.project.dataset

    def publish(step: int, rows: list[dict[str, Any]]) -> None:
        publish_table(
            "grpo-samples", dataset, rows, description=f"GRPO rollouts and rewards at step {step}"
        )

    if settings.orchestration.accelerate_config is not None:  # N processes (one per GPU)
        # the sample tables then go to the MLflow run only
        result = grpo_result(settings, run_launched(settings, "grpo"))
    else:
        result = grpo(settings, on_samples=publish)
    m = result.metrics
    stats = ["rollout", "steps", "train_seconds", "reward_first", "reward_last"]
    stats += ["distinct_items_per_group", "target_in_group", "non_finite_rewards", "best_step"]
    valid = {
        f"valid {k} (start → best)": f"{m['valid_start'][k]} → {m['valid_best'][k]}"
        for k in m["valid_best"]
    }
    publish_stats("grpo", dataset, {k: m[k] for k in stats} | valid, "GRPO training")
    return result
