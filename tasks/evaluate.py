"""Stage 8 — evaluate: HR@K / NDCG@K over the full catalog for the SFT and GRPO models and the
popularity and SASRec baselines, on the same rows, under one protocol. Writes
``metrics/eval.json`` and the per-user scores beside it (``metrics/eval_users.parquet``).

Protocol (recorded in the report next to the numbers):
- rows: every test row; for valid, the **gate half** of the validation users
  (``sidrec/protocol.py``) — the half no checkpoint was selected on, which the promotion
  gate decides on;
- ``evaluate.exclude_seen`` (default): every model ranks only items outside the user's whole
  pre-target history (all train interactions, plus the valid target when scoring test);
  the generative models exclude inside the constrained decoding;
- the SID models rank with :class:`models.recommender.SidRecommender` at ``evaluate.num_beams``:
  the recommender the registered model serves;
- uncertainty: a bootstrap interval over users per model and metric, and paired intervals of
  the differences that matter (SFT − SASRec, GRPO − SFT, best generative − SASRec). The best
  generative model is chosen on the validation **selection** half, never on the gate half
  scored here nor on test: GRPO where its own validation kept a step past its SFT start (it
  scored above that start on the selection users), else SFT.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pandas as pd
from prefect import task

from models.baselines import catalog_index, encode_histories, encode_targets
from models.baselines.popularity import Popularity
from models.baselines.sasrec import load_baseline, recommend
from models.metrics import (
    catalog_coverage,
    per_row_metrics,
    popularity_percentile,
)
from models.recommender import SidRecommender
from models.stats import bootstrap_interval, paired_bootstrap_interval
from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs, read_json
from sidrec.orchestration import StageCache, publish_table
from sidrec.protocol import fingerprint, seen_items, validation_half
from sidrec.stage import StageResult
from sidrec.tracking import log_stage, metric_key
from tasks.shared.inputs import load_catalog_and_map, load_recommender, read_split

log = logging.getLogger(__name__)
EVAL_SPLITS = ("valid", "test")
BEST = "best generative"
PAIRS = (("sft", "sasrec"), ("grpo", "sft"), (BEST, "sasrec"))
"""Paired comparisons reported as ``"<a> - <b>"`` (skipped when a model did not run)."""
TIE_RULE = "by timestamp; ties keep the source's row order (stable sort, never by id)"


def eval_rows(settings: Settings, splits: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The rows each split is scored on: the gate half of valid, all of test (capped by
    ``evaluate.max_users``)."""
    rows = {"valid": validation_half(splits["valid"], "gate"), "test": splits["test"]}
    cap = settings.evaluate.max_users
    return {name: df.head(cap) if cap else df for name, df in rows.items()}


def exclusions(
    settings: Settings, splits: dict[str, pd.DataFrame], name: str, rows: pd.DataFrame
) -> list[list[str]] | None:
    """Per row, the items it may not recommend (None when ``evaluate.exclude_seen`` is off)."""
    if not settings.evaluate.exclude_seen:
        return None
    earlier = [splits["valid"]] if name == "test" else []
    return seen_items(splits["train"], rows, earlier)


def popularity_topk(
    popularity: Popularity, n: int, k: int, exclude: list[list[str]] | None
) -> np.ndarray:
    """Popularity's top-k for ``n`` rows, each without its excluded items."""
    banned = None if exclude is None else encode_histories(exclude, popularity.index, "exclusions")
    return popularity.recommend(n, k, exclude=banned)


def evaluate(settings: Settings) -> StageResult:
    cfg, paths = settings.evaluate, settings.paths
    items, sid_map = load_catalog_and_map(settings)
    item_ids = items["item_id"].tolist()
    splits = {s: read_split(settings, s) for s in ("train", *EVAL_SPLITS)}
    k = max(cfg.ks)  # evaluate.num_beams >= k (the settings check it)
    index = catalog_index(item_ids)
    started = time.perf_counter()
    popularity = Popularity(item_ids=item_ids).fit(splits["train"])
    sasrec = load_baseline(settings.paths.sasrec_model, item_ids=item_ids)
    generators = {"sft": _generator(settings, "sft", sid_map, item_ids)}
    if settings.grpo.enabled:
        generators["grpo"] = _generator(settings, "grpo", sid_map, item_ids)

    report: dict[str, Any] = {"dataset": settings.project.dataset, "ks": list(cfg.ks)}
    report["items"] = len(item_ids)
    per_user: list[pd.DataFrame] = []
    for name, rows in eval_rows(settings, splits).items():
        if len(rows) == 0:
            raise InputError(f"no {name} rows to evaluate", path=paths.split(name))
        targets = encode_targets(list(rows["target"]), index, f"{name} targets")
        histories = [list(h) for h in rows["history"]]
        exclude = exclusions(settings, splits, name, rows)
        topks = {
            "popularity": popularity_topk(popularity, len(rows), k, exclude),
            "sasrec": recommend(sasrec, histories, k, exclude=exclude),
        }
        truncated: dict[str, int] = {}
        for model_name, generator in generators.items():
            ranking = generator.rank(histories, k, exclude=exclude, progress=True)
            topks[model_name], truncated[model_name] = ranking.items, ranking.truncated
        allowed = np.full(len(rows), len(item_ids))
        if exclude is not None:
            allowed -= np.array([sum(i in index for i in e) for e in exclude])
        report[name], frames = _score(topks, targets, cfg.ks, popularity.counts, allowed)
        for model_name, topk in topks.items():  # the rankings themselves, for inspection
            frames[model_name]["ranking"] = [[item_ids[i] for i in r if i >= 0] for r in topk]
        for model_name, frame in frames.items():
            frame.insert(0, "user_id", rows["user_id"].astype(str).to_numpy())
            frame.insert(0, "model", model_name)
            frame.insert(0, "split", name)
            per_user.append(frame)
        for model_name in generators:
            report[name][model_name]["truncated_prompts"] = truncated[model_name]
        report[f"{name}_rows"] = len(rows)
    users = pd.concat(per_user, ignore_index=True)
    best = best_generative(settings, list(generators))
    report |= _uncertainty(users, best, cfg.bootstrap_resamples, settings.project.seed)
    report["protocol"] = protocol(settings, {s: len(splits[s]) for s in EVAL_SPLITS}, report)
    report["sasrec_best_epoch"] = sasrec.best_epoch
    report["seconds"] = round(time.perf_counter() - started, 1)
    with AtomicOutputs() as out:
        out.parquet(users, paths.eval_users)
        out.json(report, paths.metrics("eval"))
    log.info("%s", summary_line(report))
    files = [paths.metrics("eval"), paths.eval_users]
    return StageResult.from_files("evaluate", files, report, summary_line(report))


def _generator(
    settings: Settings, stage: str, sid_map: dict[str, list[int]], item_ids: list[str]
) -> SidRecommender:
    """A trained SID model (``sft`` or ``grpo``) behind the shared recommender."""
    folder = settings.paths.sft_model if stage == "sft" else settings.paths.grpo_model
    hint = (
        "run `sidrec sft` first"
        if stage == "sft"
        else "run `sidrec grpo` first, or set grpo.enabled false to evaluate without it"
    )
    return load_recommender(settings, folder, sid_map, item_ids, missing_hint=hint)


def _score(
    topks: dict[str, np.ndarray],
    targets: np.ndarray,
    ks: list[int],
    counts: np.ndarray,
    allowed: np.ndarray,
) -> tuple[dict[str, dict[str, float]], dict[str, pd.DataFrame]]:
    """Mean metrics per model (with coverage@10, mean popularity percentile@10 and, for SID
    models, the invalid rate) and the per-user metric frames."""
    n_items = len(counts)
    rows, frames = {}, {}
    top = 10 if 10 in ks else max(ks)
    for model, topk in topks.items():
        values = per_row_metrics(topk, targets, ks)
        frames[model] = pd.DataFrame(values)
        row = {m: round(float(v.mean()), 6) for m, v in values.items()}
        row[f"coverage@{top}"] = round(catalog_coverage(topk, n_items, top), 6)
        row[f"popularity_percentile@{top}"] = round(popularity_percentile(topk, counts, top), 3)
        if model not in ("popularity", "sasrec"):
            # -1 beyond what exclusion explains (fewer than k items allowed) is an invalid SID
            expected = np.clip(topk.shape[1] - allowed, 0, None)
            invalid = np.clip((topk < 0).sum(1) - expected, 0, None)
            row["invalid_rate"] = round(float(invalid.sum() / topk.size), 6)
        rows[model] = row
    return rows, frames


def _uncertainty(
    users: pd.DataFrame, best: str | None, resamples: int, seed: int
) -> dict[str, Any]:
    """95% bootstrap intervals per split/model/metric and paired intervals of the differences
    (``best``: the generative model the "best generative" rows stand for), resampling users:
    under a sliding-window split a user's several rows are drawn together."""

    def users_of(df: pd.DataFrame) -> np.ndarray:
        return df["user_id"].to_numpy()

    metrics = [c for c in users.columns if c not in ("split", "model", "user_id", "ranking")]
    intervals: dict[str, Any] = {}
    paired: dict[str, Any] = {}
    for split, rows in users.groupby("split", sort=False):
        by_model = {m: df.reset_index(drop=True) for m, df in rows.groupby("model", sort=False)}
        if best is not None:
            by_model[BEST] = by_model[best]
        intervals[str(split)] = {
            model: {
                m: _rounded(
                    bootstrap_interval(
                        df[m].to_numpy(), groups=users_of(df), n_resamples=resamples, seed=seed
                    )
                )
                for m in metrics
            }
            for model, df in by_model.items()
            if model != BEST
        }
        paired[str(split)] = {
            f"{a} - {b}": {
                m: _rounded(
                    paired_bootstrap_interval(
                        by_model[a][m].to_numpy(),
                        by_model[b][m].to_numpy(),
                        groups=users_of(by_model[a]),
                        n_resamples=resamples,
                        seed=seed,
                    )
                )
                for m in metrics
            }
            for a, b in PAIRS
            if a in by_model and b in by_model
        }
    return {"best_generative": best, "intervals": intervals, "paired": paired}


def best_generative(settings: Settings, generative: list[str]) -> str | None:
    """The SID model the "best generative" rows stand for, chosen on the validation selection
    half: GRPO where its validation kept a step past its start (``kept_step.json`` in the GRPO
    model folder, written with the weights), i.e. it scored above its SFT start on those
    users; else SFT."""
    if "grpo" not in generative:
        return generative[0] if generative else None
    path = settings.paths.grpo_kept_step
    record = read_json(
        path, "GRPO kept step", "run `sidrec grpo` again (it writes it into its model folder)"
    )
    step = record.get("best_step") if isinstance(record, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise InputError(
            f"the GRPO model folder names no kept step (best_step: {step!r}); re-run `sidrec grpo`",
            path=path,
        )
    return "grpo" if step > 0 else "sft"


def _rounded(interval: Any) -> dict[str, float]:
    return {
        "mean": round(interval.mean, 6),
        "low": round(interval.low, 6),
        "high": round(interval.high, 6),
    }


def protocol(
    settings: Settings, split_rows: dict[str, int], report: dict[str, Any]
) -> dict[str, Any]:
    """How the numbers were made, with fingerprints of what they were made from (the register
    stage refuses metrics whose fingerprints do not match today's files)."""
    paths = settings.paths
    models = {"sft": paths.sft_model, "grpo": paths.grpo_model}
    return {
        "split": {
            "method": settings.split.method,
            "ties": TIE_RULE,
            "max_history": settings.split.max_history,
        },
        "valid_users": "gate half of the validation users (sidrec/protocol.py); the selection half picks checkpoints",
        "exclude_seen": settings.evaluate.exclude_seen,
        "num_beams": settings.evaluate.num_beams,
        "users": {s: report[f"{s}_rows"] for s in EVAL_SPLITS},
        "split_rows": split_rows,
        "bootstrap": {"confidence": 0.95, "resamples": settings.evaluate.bootstrap_resamples},
        "fingerprints": {
            "split": fingerprint([paths.split(s) for s in ("train", *EVAL_SPLITS)]),
            "sid_map": fingerprint([paths.sid_map]),
            "sasrec": fingerprint([paths.sasrec_model]),
            **{
                f"{name}_model": fingerprint([folder])
                for name, folder in models.items()
                if name == "sft" or settings.grpo.enabled
            },
        },
    }


def verdict(interval: dict[str, float]) -> str:
    """Words for a paired interval of a − b: "beats" only where it excludes 0."""
    if interval["low"] > 0:
        return "beats"
    if interval["high"] < 0:
        return "trails"
    return "is within noise of"


def summary_line(report: dict[str, Any]) -> str:
    """One line for the run summary: test NDCG@10 with intervals, and the key comparison."""
    metric = "ndcg@10" if "ndcg@10" in report["test"]["popularity"] else f"ndcg@{max(report['ks'])}"
    parts = []
    for model, row in report["test"].items():
        ci = report["intervals"]["test"][model][metric]
        parts.append(f"{model} {row[metric]:.4f} [{ci['low']:.4f}, {ci['high']:.4f}]")
    line = f"test {metric.upper()}: " + " · ".join(parts)
    diff = report["paired"]["test"].get(f"{BEST} - sasrec", {}).get(metric)
    if diff is not None:
        line += (
            f" · {report['best_generative']} {verdict(diff)} sasrec "
            f"({diff['mean']:+.4f} [{diff['low']:+.4f}, {diff['high']:+.4f}])"
        )
    return line


@task(name="evaluate", cache_policy=StageCache(stage="evaluate"), persist_result=True)
def evaluate_task(settings: Settings) -> StageResult:
    result = evaluate(settings)
    m = result.metrics
    table = [
        {
            "split": s,
            "model": model,
            **row,
            **{
                f"{k} 95% CI": f"[{ci['low']:.4f}, {ci['high']:.4f}]"
                for k, ci in m["intervals"][s][model].items()
                if k.startswith("ndcg")
            },
        }
        for s in EVAL_SPLITS
        for model, row in m[s].items()
    ]
    table += [
        {
            "split": s,
            "model": pair,
            **{
                f"{k} (paired)": f"{ci['mean']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}]"
                for k, ci in diffs.items()
            },
        }
        for s in EVAL_SPLITS
        for pair, diffs in m["paired"][s].items()
    ]
    publish_table(
        "eval",
        m["dataset"],
        table,
        description="HR@K / NDCG@K over the full catalog, 95% bootstrap intervals over users; "
        "paired rows: interval of the difference (a − b)",
    )
    log_stage(
        dataset=m["dataset"],
        stage="evaluate",
        params=settings.section("evaluate"),
        metrics={
            f"{s}.{model}.{metric_key(k)}": v
            for s in EVAL_SPLITS
            for model, row in m[s].items()
            for k, v in row.items()
        },
        artifacts=[settings.paths.metrics("eval"), settings.paths.eval_users],
    )
    return result
