"""Stage 8 — evaluate: HR@K / NDCG@K over the full catalog on the valid and test splits, for
the SFT and GRPO models (constrained beam search over the SID map) and, trained on the same split in
the same run, the popularity and SASRec baselines. Writes ``metrics/eval.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task

from models.baselines import catalog_index, encode_targets
from models.baselines.popularity import Popularity
from models.baselines.sasrec import SASRecConfig, recommend, train_sasrec
from models.constrained import SidTrie, rank_items
from models.lm import load_model_dir
from models.metrics import rank_metrics
from models.prompts import PromptBuilder
from models.sid import SidMap, collision_stats
from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.io import atomic_write_json, read_table
from sidrec.orchestration import StageCache, publish_table
from sidrec.schemas import SPLIT
from sidrec.stage import StageResult
from sidrec.tracking import log_stage
from tasks.sft import load_catalog_and_map

log = logging.getLogger(__name__)
EVAL_SPLITS = ("valid", "test")


def catalog_trie(sid_map: SidMap, item_ids: list[str], tokenizer: Any, path: Path) -> SidTrie:
    """The catalog's SIDs as token ids of a model's tokenizer (rows in catalog order); a clear
    error when the model folder at ``path`` was not trained with this SID map."""
    try:
        return SidTrie.from_sid_map({i: sid_map[i] for i in item_ids}, tokenizer)
    except ValueError as exc:
        raise InputError(
            f"the SID map does not match the model's tokenizer: {exc}", path=path
        ) from None


class SidRecommender:
    """A SID-generating model (SFT or GRPO) behind constrained beam search over the catalog."""

    def __init__(
        self,
        path: Path,
        settings: Settings,
        sid_map: SidMap,
        item_ids: list[str],
        missing_hint: str = "run `sidrec sft` first",
    ):
        self.model, self.tokenizer = load_model_dir(path, missing_hint)
        self.trie = catalog_trie(sid_map, item_ids, self.tokenizer, path)
        titles = dict.fromkeys(item_ids, "")  # evaluation prompts use SIDs only
        self.prompts = PromptBuilder(
            tokenizer=self.tokenizer,
            sid_map=sid_map,
            titles=titles,
            max_length=settings.model.max_length,
        )
        self.cfg = settings.evaluate

    def topk(self, histories: list[list[str]], k: int) -> tuple[np.ndarray, int]:
        """(rows × k) catalog indices, best first (-1 = invalid SID), and the truncated-prompt count."""
        before = self.prompts.truncated
        prompts = [self.prompts.history_prompt(h) for h in histories]
        items = rank_items(
            self.model,
            self.tokenizer,
            prompts,
            self.trie,
            num_beams=self.cfg.num_beams,
            top_k=k,
            batch_size=self.cfg.batch_size,
            max_prompt_tokens=self.prompts.max_prompt,
        )
        return items, self.prompts.truncated - before


def evaluate(settings: Settings) -> StageResult:
    cfg = settings.evaluate
    paths = settings.paths
    items, sid_map = load_catalog_and_map(settings)
    item_ids = items["item_id"].tolist()
    assert collision_stats(np.array([sid_map[i] for i in item_ids])).collision_rate == 0, (
        "SIDs must be unique"
    )
    splits = {s: read_table(paths.split(s), SPLIT, f"{s} split") for s in ("train", *EVAL_SPLITS)}
    if cfg.max_users is not None:
        splits |= {s: splits[s].head(cfg.max_users) for s in EVAL_SPLITS}
    k = max(cfg.ks)
    if cfg.num_beams < k:
        raise InputError(f"evaluate.num_beams ({cfg.num_beams}) must be >= the largest K ({k})")
    index = catalog_index(item_ids)
    started = time.perf_counter()
    popularity = Popularity(item_ids=item_ids).fit(splits["train"])
    sasrec = train_sasrec(
        splits["train"],
        splits["valid"],
        item_ids,
        SASRecConfig(
            max_epochs=cfg.sasrec_max_epochs,
            patience=cfg.sasrec_patience,
            seed=settings.project.seed,
        ),
    )
    generators = {"sft": SidRecommender(paths.sft_model, settings, sid_map, item_ids)}
    if settings.grpo.enabled:
        generators["grpo"] = SidRecommender(
            paths.grpo_model,
            settings,
            sid_map,
            item_ids,
            "run `sidrec grpo` first, or set grpo.enabled false to evaluate without it",
        )
    report: dict[str, Any] = {
        "dataset": settings.project.dataset,
        "ks": list(cfg.ks),
        "items": len(item_ids),
    }
    for name in EVAL_SPLITS:
        split = splits[name]
        targets = encode_targets(list(split["target"]), index, f"{name} targets")
        rows = {
            "popularity": rank_metrics(popularity.recommend(len(split), k), targets, cfg.ks),
            "sasrec": rank_metrics(
                recommend(sasrec.model, list(split["history"]), k), targets, cfg.ks
            ),
        }
        for model_name, generator in generators.items():
            items, truncated = generator.topk([list(h) for h in split["history"]], k)
            rows[model_name] = rank_metrics(items, targets, cfg.ks)
            rows[model_name]["invalid_rate"] = float((items < 0).mean())
        report[name] = {model: {m: round(v, 6) for m, v in r.items()} for model, r in rows.items()}
        report[f"{name}_rows"] = len(split)
        report[f"{name}_truncated_prompts"] = truncated
    report["sasrec_best_epoch"] = int(sasrec.best_epoch)
    report["seconds"] = round(time.perf_counter() - started, 1)
    atomic_write_json(paths.metrics("eval"), report)
    log.info("test NDCG@10: %s", {m: r["ndcg@10"] for m, r in report["test"].items()})
    return StageResult.from_files("evaluate", [paths.metrics("eval")], report)


@task(name="evaluate", cache_policy=StageCache(stage="evaluate"), persist_result=True)
def evaluate_task(settings: Settings) -> StageResult:
    result = evaluate(settings)
    m = result.metrics
    table = [
        {"split": s, "model": model, **row} for s in EVAL_SPLITS for model, row in m[s].items()
    ]
    publish_table("eval", m["dataset"], table, description="HR@K / NDCG@K over the full catalog")
    log_stage(
        dataset=m["dataset"],
        stage="evaluate",
        params=settings.section("evaluate"),
        # MLflow metric names allow no "@": hr@10 → hr_at_10
        metrics={
            f"{s}.{model}.{k.replace('@', '_at_')}": v
            for s in EVAL_SPLITS
            for model, row in m[s].items()
            for k, v in row.items()
        },
        artifacts=[settings.paths.metrics("eval")],
    )
    return result
