"""Stage 5b — baselines: the SASRec baseline, trained once per run on the train split.

Checkpoints are selected (early stopping) on the *selection* half of the validation users
(:func:`sidrec.protocol.validation_half`), never on the gate half the promotion gate judges
on. The model goes to ``artifacts/baselines/<ds>/sasrec/`` (``model.pt`` + ``config.json``),
which GRPO's collaborative reward and the evaluation load (``models.baselines.sasrec.load_baseline``); metrics
go to ``metrics/baselines.json``. Popularity is not stored: it is counted where it is used,
in no time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prefect import task

from models.baselines.sasrec import (
    CONFIG_FILE,
    WEIGHTS_FILE,
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
        patience=cfg.patience,
        seed=settings.project.seed,
    )


def baselines(settings: Settings) -> StageResult:
    """Train SASRec on the train split, early-stopped on the validation selection half."""
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
        result = train_sasrec(train, selection, item_ids, config, exclude=seen)
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
        "valid_selection": {k: round(v, 6) for k, v in best.items() if "@" in k},
        "seconds": round(seconds, 1),
    }
    with AtomicOutputs() as out:
        out.folder(paths.sasrec_model, lambda folder: save_sasrec(result.model, folder))
        out.json(metrics, paths.metrics("baselines"))
    log.info(
        "SASRec: best epoch %d of %d, valid-selection NDCG@10 %.4f, %.0f s",
        metrics["best_epoch"],
        metrics["epochs_run"],
        best["ndcg@10"],
        seconds,
    )
    model_files = [paths.sasrec_model / name for name in (WEIGHTS_FILE, CONFIG_FILE)]
    summary = (
        f"SASRec max_len {metrics['max_len']} · best epoch {metrics['best_epoch']} of "
        f"{metrics['epochs_run']} · valid-selection NDCG@10 "
        f"{metrics['valid_selection']['ndcg@10']:.4f} · {metrics['seconds']:.0f} s"
    )
    files = [*model_files, paths.metrics("baselines")]
    return StageResult.from_files("baselines", files, metrics, summary)


@task(name="baselines", cache_policy=StageCache(stage="baselines"), persist_result=True)
def baselines_task(settings: Settings) -> StageResult:
    result = baselines(settings)
    m = result.metrics
    publish_stats(
        "baselines",
        m["dataset"],
        {k: m[k] for k in ("max_len", "windows", "best_epoch", "epochs_run", "seconds")}
        | {f"valid selection {k}": v for k, v in m["valid_selection"].items()},
        description="SASRec baseline training",
    )
    log_stage(
        dataset=m["dataset"],
        stage="baselines",
        params={"sasrec": {**settings.section("sasrec"), "max_len": m["max_len"]}},  # resolved
        metrics={
            **{k: m[k] for k in ("windows", "best_epoch", "epochs_run", "seconds")},
            **{f"valid_selection.{metric_key(k)}": v for k, v in m["valid_selection"].items()},
        },
        artifacts=[settings.paths.metrics("baselines")],
    )
    return result
