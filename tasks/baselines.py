"""Stage 5b — baselines: SASRec, trained once per run on the train split, then EASE's L2 and
the SASRec + EASE blend's weight, chosen from their grids (the ``ease`` section).

Every choice is made on the *selection* half of the validation users
(:func:`sidrec.protocol.validation_half`), ranked as evaluate ranks (seen items excluded under
``evaluate.exclude_seen``), never on the gate half the promotion gate judges on: SASRec's
checkpoint (early stopping), then EASE's L2 by NDCG@10, then the blend's α with EASE at that
L2. SASRec keeps its training state in ``artifacts/baselines/<ds>/sasrec-resume.pt`` after
every epoch, so a stopped stage goes on from its last epoch (the file is removed once the
outputs are written). SASRec goes to ``artifacts/baselines/<ds>/sasrec/`` (``model.pt`` + ``config.json``),
which SFT's teacher, GRPO's collaborative reward and the evaluation load
(``models.baselines.sasrec.load_baseline``); EASE's choice to ``artifacts/baselines/<ds>/
ease.json`` (:mod:`tasks.shared.baselines`: evaluate refits EASE from it), or, past EASE's
catalog limit, the reason the ease and blend rows are left out; metrics to
``metrics/baselines.json``. Popularity is not stored: it is counted where it is used, in no
time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pandas as pd
from prefect import task

from models.baselines import catalog_index, encode_histories, encode_targets
from models.baselines.blend import (
    Rows,
    choose_alpha,
    choose_l2,
    ease_scorer,
    sasrec_scorer,
)
from models.baselines.sasrec import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    SASRec,
    SASRecConfig,
    save_sasrec,
    train_sasrec,
)
from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs, read_table
from sidrec.orchestration import StageCache, publish_stats
from sidrec.protocol import seen_items, validation_half
from sidrec.schemas import ITEMS, SPLIT
from sidrec.stage import StageResult
from sidrec.tracking import log_stage, metric_key
from tasks.shared.baselines import EaseChoice, left_out_reason

log = logging.getLogger(__name__)


def sasrec_config(settings: Settings) -> SASRecConfig:
    """The model options from the ``sasrec`` section; ``max_len`` null = ``split.max_history``.
    It trains on the GPU where one is visible, as SFT and GRPO do (a GPU worker; untested on
    this project's CPU machines), else on the CPU."""
    import torch

    cfg = settings.sasrec
    return SASRecConfig(
        device="cuda" if torch.cuda.is_available() else "cpu",
        hidden=cfg.hidden,
        blocks=cfg.blocks,
        heads=cfg.heads,
        dropout=cfg.dropout,
        max_len=cfg.max_len or settings.split.max_history,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        max_epochs=cfg.max_epochs,
        lr_schedule=cfg.lr_schedule,
        patience=cfg.patience,
        seed=settings.project.seed,
    )


def baselines(settings: Settings) -> StageResult:
    """Train SASRec on the train split, early-stopped on the validation selection half, then
    choose EASE's L2 and the blend's weight on the same rows."""
    paths = settings.paths
    item_ids = read_table(paths.validated("items"), ITEMS, "validated items")["item_id"].tolist()
    train = read_table(paths.split("train"), SPLIT, "train split")
    valid = read_table(paths.split("valid"), SPLIT, "valid split")
    selection = validation_half(valid, "selection")
    if selection.empty:
        raise InputError(
            f"none of the {len(valid)} validation rows belongs to the selection half of the "
            "validation users, so SASRec has nothing to select its checkpoint on; the dataset "
            "needs more users",
            path=paths.split("valid"),
        )
    config = sasrec_config(settings)
    started = time.perf_counter()
    try:
        # checkpoints chosen as SFT and GRPO choose theirs: ranked as evaluate ranks
        seen = seen_items(train, selection) if settings.evaluate.exclude_seen else None
        result = train_sasrec(
            train, selection, item_ids, config, exclude=seen, resume=paths.sasrec_resume
        )
    except ValueError as exc:
        raise InputError(f"SASRec cannot train on the splits: {exc}") from None
    seconds = time.perf_counter() - started
    best = next(r for r in result.history if r["epoch"] == result.best_epoch)
    metrics: dict[str, Any] = {
        "dataset": settings.project.dataset,
        "model": "sasrec",
        "max_len": config.max_len,
        "windows": result.windows,
        "valid_selection_rows": len(selection),
        "valid_selection_exclude_seen": settings.evaluate.exclude_seen,
        "best_epoch": result.best_epoch,
        "epochs_run": int(result.history[-1]["epoch"]),
        "resumed_after_epoch": result.resumed_after,
        "valid_selection": {k: round(v, 6) for k, v in best.items() if "@" in k},
        "seconds": round(seconds, 1),
    }
    choice, metrics["ease"], metrics["blend"] = choose_ease(
        settings, item_ids, train, selection, seen, result.model
    )
    with AtomicOutputs() as out:
        out.folder(paths.sasrec_model, lambda folder: save_sasrec(result.model, folder))
        out.json(choice._asdict(), paths.ease_choice)
        out.json(metrics, paths.metrics("baselines"))
    paths.sasrec_resume.unlink(missing_ok=True)
    log.info(
        "SASRec: best epoch %d of %d, valid-selection NDCG@10 %.4f, %.0f s",
        metrics["best_epoch"],
        metrics["epochs_run"],
        best["ndcg@10"],
        seconds,
    )
    model_files = [paths.sasrec_model / name for name in (WEIGHTS_FILE, CONFIG_FILE)]
    files = [*model_files, paths.ease_choice, paths.metrics("baselines")]
    return StageResult.from_files("baselines", files, metrics, summary_line(metrics))


def choose_ease(
    settings: Settings,
    item_ids: list[str],
    train: pd.DataFrame,
    selection: pd.DataFrame,
    seen: list[list[str]] | None,
    sasrec: SASRec,
) -> tuple[EaseChoice, dict[str, Any], dict[str, Any]]:
    """EASE's L2 (``ease.l2_grid``), then the blend's α (``ease.blend_alphas``), each by
    NDCG@10 on the selection rows with ``seen`` excluded; returns the choice and the metrics of
    EASE and of the blend. Past EASE's catalog limit both are left out, with the reason."""
    reason = left_out_reason(len(item_ids))
    if reason is not None:
        log.warning("EASE and the blend are left out: %s", reason)
        return EaseChoice(None, None, None, reason), {"left_out": reason}, {"left_out": reason}
    cfg = settings.ease
    index = catalog_index(item_ids)
    rows = Rows(
        histories=encode_histories(list(selection["history"]), index, "selection histories"),
        targets=encode_targets(list(selection["target"]), index, "selection targets"),
        exclude=None if seen is None else encode_histories(seen, index, "exclusions"),
    )
    started = time.perf_counter()
    l2, ease = choose_l2(
        item_ids=item_ids,
        train=train,
        recency=cfg.recency,
        grid=cfg.l2_grid,
        rows=rows,
        edge_steps=cfg.l2_edge_steps,
    )
    alpha = choose_alpha(
        sasrec=sasrec_scorer(sasrec), ease=ease_scorer(ease), alphas=cfg.blend_alphas, rows=rows
    )
    seconds = round(time.perf_counter() - started, 1)
    log.info(
        "EASE: l2 %g (valid-selection NDCG@10 %.4f); blend: α %g (%.4f); %.0f s",
        l2.value,
        l2.scores[l2.value],
        alpha.value,
        alpha.scores[alpha.value],
        seconds,
    )
    ease_metrics = {
        "l2": l2.value,
        "recency": cfg.recency,
        "valid_selection": {"ndcg@10": round(l2.scores[l2.value], 6)},
        "l2_grid": {f"{v:g}": round(score, 6) for v, score in l2.scores.items()},
        "seconds": seconds,
    }
    blend_metrics = {
        "alpha": alpha.value,
        "valid_selection": {"ndcg@10": round(alpha.scores[alpha.value], 6)},
        "alpha_grid": {f"{v:g}": round(score, 6) for v, score in alpha.scores.items()},
    }
    return EaseChoice(l2.value, cfg.recency, alpha.value, None), ease_metrics, blend_metrics


def summary_line(metrics: dict[str, Any]) -> str:
    """SASRec's training, then EASE's and the blend's choice (or why they were left out)."""
    line = (
        f"SASRec max_len {metrics['max_len']} · best epoch {metrics['best_epoch']} of "
        f"{metrics['epochs_run']} · valid-selection NDCG@10 "
        f"{metrics['valid_selection']['ndcg@10']:.4f} · {metrics['seconds']:.0f} s"
    )
    ease, blend = metrics["ease"], metrics["blend"]
    if "left_out" in ease:
        return f"{line} · EASE and blend left out ({ease['left_out']})"
    return (
        f"{line} · EASE l2 {ease['l2']:g} {ease['valid_selection']['ndcg@10']:.4f} · "
        f"blend α {blend['alpha']:g} {blend['valid_selection']['ndcg@10']:.4f}"
    )


@task(name="baselines", cache_policy=StageCache(stage="baselines"), persist_result=True)
def baselines_task(settings: Settings) -> StageResult:
    result = baselines(settings)
    m = result.metrics
    chosen = _chosen(m)
    publish_stats(
        "baselines",
        m["dataset"],
        {k: m[k] for k in ("max_len", "windows", "best_epoch", "epochs_run", "seconds")}
        | {f"valid selection {k}": v for k, v in m["valid_selection"].items()}
        | chosen
        | ({"ease and blend left out": m["ease"]["left_out"]} if not chosen else {}),
        description="SASRec training; EASE's L2 and the blend's weight chosen on the selection half",
    )
    log_stage(
        dataset=m["dataset"],
        stage="baselines",
        params={
            "sasrec": {**settings.section("sasrec"), "max_len": m["max_len"]},  # resolved
            "ease": settings.section("ease"),
        },
        metrics={
            **{k: m[k] for k in ("windows", "best_epoch", "epochs_run", "seconds")},
            **{f"valid_selection.{metric_key(k)}": v for k, v in m["valid_selection"].items()},
            **{metric_key(k): v for k, v in chosen.items()},
        },
        artifacts=[settings.paths.metrics("baselines"), settings.paths.ease_choice],
    )
    return result


def _chosen(metrics: dict[str, Any]) -> dict[str, float]:
    """EASE's and the blend's chosen values and selection scores, as flat numbers (none where
    they were left out)."""
    ease, blend = metrics["ease"], metrics["blend"]
    if "left_out" in ease:
        return {}
    return {
        "ease.l2": ease["l2"],
        "ease.valid_selection.ndcg@10": ease["valid_selection"]["ndcg@10"],
        "blend.alpha": blend["alpha"],
        "blend.valid_selection.ndcg@10": blend["valid_selection"]["ndcg@10"],
    }
