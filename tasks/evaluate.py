"""Stage 8 — evaluate: HR@K / NDCG@K over the full catalog for the SFT and GRPO models and the
popularity, SASRec, EASE and SASRec + EASE blend baselines, on the same rows, under one
protocol. Writes ``metrics/eval.json`` and the per-user scores beside it
(``metrics/eval_users.parquet``).

Protocol (recorded in the report next to the numbers):
- rows: every test row; for valid, the **gate half** of the validation users
  (``sidrec/protocol.py``) — the half no checkpoint was selected on, which the promotion
  gate decides on;
- ``evaluate.exclude_seen`` (default): every model ranks only items outside the user's whole
  pre-target history (all train interactions, plus the valid target when scoring test);
  the generative models exclude inside the constrained decoding;
- EASE and the blend rank with the L2 and weight the ``baselines`` stage chose on the
  selection half (``tasks/shared/baselines.py``); past EASE's catalog limit both rows are
  left out and the protocol says why;
- the SID models rank with :class:`models.recommender.SidRecommender` at ``evaluate.num_beams``:
  the recommender the registered model serves;
- uncertainty: a bootstrap interval over users per model and metric, and paired intervals of
  the differences that matter (each generative model − SASRec and − the best baseline, GRPO −
  SFT, best generative − SASRec and − the best baseline). The best generative model is chosen
  on the validation **selection** half, never on the gate half scored here nor on test: GRPO
  where its own validation kept a step past its SFT start (it scored above that start on the
  selection users), else SFT. The **best baseline** is the baseline with the highest NDCG@10
  on the gate half (the promotion gate's users: ``register.gate_best_baseline`` refuses a
  candidate that trails it there).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from prefect import task

from models.baselines import catalog_index, encode_histories, encode_targets
from models.baselines.ease import EASE
from models.baselines.popularity import Popularity
from models.baselines.sasrec import SASRec, load_baseline, recommend
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
from tasks.shared.baselines import (
    EASE_ROWS,
    EaseChoice,
    ease_topks,
    fitted_ease,
    read_ease_choice,
)
from tasks.shared.inputs import load_catalog_and_map, load_recommender, read_split

log = logging.getLogger(__name__)
EVAL_SPLITS = ("valid", "test")
BEST = "best generative"
BEST_BASELINE = "best baseline"
BASELINES = ("popularity", "sasrec", *EASE_ROWS)
"""The baselines, in the order of the report (the generative models follow)."""
PAIRS = (
    ("sft", "sasrec"),
    ("grpo", "sft"),
    (BEST, "sasrec"),
    ("grpo", "sasrec"),
    ("sft", BEST_BASELINE),
    ("grpo", BEST_BASELINE),
    (BEST, BEST_BASELINE),
)
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
    paths = settings.paths
    report, users = score_models(settings)
    with AtomicOutputs() as out:
        out.parquet(users, paths.eval_users)
        out.json(report, paths.metrics("eval"))
    log.info("%s", summary_line(report))
    files = [paths.metrics("eval"), paths.eval_users]
    return StageResult.from_files("evaluate", files, report, summary_line(report))


@dataclass(frozen=True)
class Rankers:
    """Every model evaluate ranks with, loaded once (:func:`load_rankers`)."""

    item_ids: list[str]
    index: dict[str, int]
    k: int
    """Ranking depth: the largest of ``evaluate.ks``."""
    popularity: Popularity
    sasrec: SASRec
    choice: EaseChoice
    ease: EASE | None
    """None past EASE's catalog limit (``left_out`` says why)."""
    left_out: dict[str, str]
    generators: dict[str, SidRecommender]
    """The SID models by name (``sft``, ``grpo``); empty for the baselines alone."""


def load_rankers(
    settings: Settings,
    item_ids: list[str],
    sid_map: dict[str, list[int]],
    train: pd.DataFrame,
    *,
    generative: bool = True,
) -> Rankers:
    """Popularity and EASE fitted on the train split, SASRec and (with ``generative``) the SID
    models loaded from the stages that trained them (a missing one named in that order)."""
    sasrec = load_baseline(settings.paths.sasrec_model, item_ids=item_ids)
    choice = read_ease_choice(settings)
    ease, left_out = fitted_ease(choice, item_ids, train)
    generators = {}
    if generative:
        generators["sft"] = _generator(settings, "sft", sid_map, item_ids)
        if settings.grpo.enabled:
            generators["grpo"] = _generator(settings, "grpo", sid_map, item_ids)
    return Rankers(
        item_ids=item_ids,
        index=catalog_index(item_ids),
        k=max(settings.evaluate.ks),  # evaluate.num_beams >= k (the settings check it)
        popularity=Popularity(item_ids=item_ids).fit(train),
        sasrec=sasrec,
        choice=choice,
        ease=ease,
        left_out=left_out,
        generators=generators,
    )


def rank_rows(
    settings: Settings,
    rankers: Rankers,
    splits: dict[str, pd.DataFrame],
    name: str,
    rows: pd.DataFrame,
) -> tuple[dict[str, dict[str, float]], pd.DataFrame]:
    """Rank ``rows`` (of split ``name``: ``test`` also excludes the valid target) with every
    model under the protocol; the report's rows for them (mean metrics per model) and the
    per-user frame (``split`` = ``name``, ``model``, ``user_id``, the metrics, ``ranking``)."""
    cfg = settings.evaluate
    k, index, item_ids = rankers.k, rankers.index, rankers.item_ids
    targets = encode_targets(list(rows["target"]), index, f"{name} targets")
    histories = [list(h) for h in rows["history"]]
    exclude = exclusions(settings, splits, name, rows)
    log.info("%s: ranking %d rows with the baselines", name, len(rows))
    topks = {
        "popularity": popularity_topk(rankers.popularity, len(rows), k, exclude),
        "sasrec": recommend(rankers.sasrec, histories, k, exclude=exclude),
    }
    if rankers.ease is not None:
        alpha = rankers.choice.alpha
        assert alpha is not None  # read_ease_choice checks it
        topks |= ease_topks(rankers.sasrec, rankers.ease, alpha, histories, exclude, index, k)
    truncated: dict[str, int] = {}
    for model_name, generator in rankers.generators.items():
        ranking = generator.rank(histories, k, exclude=exclude, progress=True)
        topks[model_name], truncated[model_name] = ranking.items, ranking.truncated
    allowed = np.full(len(rows), len(item_ids))
    if exclude is not None:
        allowed -= np.array([sum(i in index for i in e) for e in exclude])
    report, frames = _score(topks, targets, cfg.ks, rankers.popularity.counts, allowed)
    for model_name, topk in topks.items():  # the rankings themselves, for inspection
        frames[model_name]["ranking"] = [[item_ids[i] for i in r if i >= 0] for r in topk]
    for model_name, frame in frames.items():
        frame.insert(0, "user_id", rows["user_id"].astype(str).to_numpy())
        frame.insert(0, "model", model_name)
        frame.insert(0, "split", name)
    for model_name in rankers.generators:
        report[model_name]["truncated_prompts"] = truncated[model_name]
    return report, pd.concat(frames.values(), ignore_index=True)


def score_models(
    settings: Settings, *, generative: bool = True
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Rank the same rows with every model under one protocol and return ``metrics/eval.json``'s
    report and the per-user scores, writing nothing (:func:`evaluate` writes them).
    ``generative=False`` scores the baselines alone (a baselines-only seed of
    ``bench.quality``: no SID model needs to exist)."""
    cfg, paths = settings.evaluate, settings.paths
    items, sid_map = load_catalog_and_map(settings)
    item_ids = items["item_id"].tolist()
    splits = {s: read_split(settings, s) for s in ("train", *EVAL_SPLITS)}
    started = time.perf_counter()
    rankers = load_rankers(settings, item_ids, sid_map, splits["train"], generative=generative)
    generators = list(rankers.generators)
    report: dict[str, Any] = {"dataset": settings.project.dataset, "ks": list(cfg.ks)}
    report["items"] = len(item_ids)
    per_user: list[pd.DataFrame] = []
    for name, rows in eval_rows(settings, splits).items():
        if len(rows) == 0:
            raise InputError(f"no {name} rows to evaluate", path=paths.split(name))
        report[name], frame = rank_rows(settings, rankers, splits, name, rows)
        per_user.append(frame)
        report[f"{name}_rows"] = len(rows)
    users = pd.concat(per_user, ignore_index=True)
    best = best_generative(settings, generators)
    baseline = best_baseline(users, cfg.ks)
    report |= _uncertainty(
        users, best, cfg.bootstrap_resamples, settings.project.seed, best_baseline=baseline
    )
    report["protocol"] = protocol(
        settings, {s: len(splits[s]) for s in EVAL_SPLITS}, report, generators
    )
    report["protocol"]["baselines"] = _baselines_record(rankers.choice, rankers.left_out)
    report["protocol"]["history"] = history_record(settings, sid_map, report, generators)
    report["sasrec_best_epoch"] = rankers.sasrec.best_epoch
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report, users


def history_record(
    settings: Settings,
    sid_map: dict[str, list[int]],
    report: dict[str, Any],
    generative: list[str],
) -> dict[str, Any]:
    """How much of each row's history every model reads: the protocol's (``split.max_history``),
    SASRec's window, EASE's (the whole protocol history) and, for the SID models, the items that
    fit their context (``model.max_length`` tokens, ``levels + 1`` per item after one BOS, in
    the sequence prompt format) with the number of prompts cut to fit it."""
    protocol_items = settings.split.max_history
    record: dict[str, Any] = {
        "protocol_items": protocol_items,
        "sasrec_items": settings.sasrec.max_len or protocol_items,
        "ease_items": protocol_items,
    }
    if generative:
        levels = max((len(sid) for sid in sid_map.values()), default=1)
        fits = (
            (settings.model.max_length - 1) // (levels + 1)
            if settings.sft.objective == "sequence"
            else None  # text prompts: as many of the newest items as fit model.max_length
        )
        if fits is not None and protocol_items is not None:
            fits = min(fits, protocol_items)
        record["generative"] = {
            "context_tokens": settings.model.max_length,
            "context_items": fits,
            "cut_prompts": {
                split: {m: report[split][m]["truncated_prompts"] for m in generative}
                for split in EVAL_SPLITS
            },
        }
    return record


def _baselines_record(choice: EaseChoice, left_out: dict[str, str]) -> dict[str, Any]:
    """Which baselines ran, which were left out and why, and EASE's and the blend's settings
    (chosen on the validation selection half by the baselines stage)."""
    record: dict[str, Any] = {
        "ran": [m for m in BASELINES if m not in left_out],
        "left_out": left_out,
        "best_baseline": "the baseline with the highest NDCG@10 on the gate half",
    }
    if not left_out:
        record["ease"] = {"l2": choice.l2, "recency": choice.recency}
        record["blend"] = {"alpha": choice.alpha}
        record["chosen_on"] = "selection half of the validation users (the baselines stage)"
    return record


def headline_metric(ks: list[int]) -> str:
    """NDCG@10, or NDCG at the largest K where 10 is not among ``ks``."""
    return "ndcg@10" if 10 in ks else f"ndcg@{max(ks)}"


def best_baseline(users: pd.DataFrame, ks: list[int]) -> str:
    """The baseline with the highest mean :func:`headline_metric` over the gate half of the
    validation users (the ``valid`` rows of ``users``; ties: the first of :data:`BASELINES`)."""
    metric = headline_metric(ks)
    valid = users[users["split"] == "valid"]
    means = {m: valid.loc[valid["model"] == m, metric].mean() for m in BASELINES}
    ran = [m for m in BASELINES if pd.notna(means[m])]
    if not ran:
        raise InputError("no baseline was scored on the validation gate users")
    return max(ran, key=lambda m: (means[m], -ran.index(m)))


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
        if model not in BASELINES:
            # -1 beyond what exclusion explains (fewer than k items allowed) is an invalid SID
            expected = np.clip(topk.shape[1] - allowed, 0, None)
            invalid = np.clip((topk < 0).sum(1) - expected, 0, None)
            row["invalid_rate"] = round(float(invalid.sum() / topk.size), 6)
        rows[model] = row
    return rows, frames


def _uncertainty(
    users: pd.DataFrame,
    best: str | None,
    resamples: int,
    seed: int,
    *,
    best_baseline: str | None = None,
) -> dict[str, Any]:
    """95% bootstrap intervals per split/model/metric and paired intervals of the differences
    (``best``: the generative model the "best generative" rows stand for; ``best_baseline``:
    the baseline the "best baseline" rows stand for), resampling users: under a sliding-window
    split a user's several rows are drawn together."""

    def users_of(df: pd.DataFrame) -> np.ndarray:
        return df["user_id"].to_numpy()

    metrics = [c for c in users.columns if c not in ("split", "model", "user_id", "ranking")]
    intervals: dict[str, Any] = {}
    paired: dict[str, Any] = {}
    for split, rows in users.groupby("split", sort=False):
        by_model = {m: df.reset_index(drop=True) for m, df in rows.groupby("model", sort=False)}
        if best is not None:
            by_model[BEST] = by_model[best]
        if best_baseline is not None:
            by_model[BEST_BASELINE] = by_model[best_baseline]
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
            if model not in (BEST, BEST_BASELINE)
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
    return {
        "best_generative": best,
        "best_baseline": best_baseline,
        "intervals": intervals,
        "paired": paired,
    }


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
    settings: Settings,
    split_rows: dict[str, int],
    report: dict[str, Any],
    generative: list[str],
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
            "ease": fingerprint([paths.ease_choice]),
            **{
                f"{name}_model": fingerprint([folder])
                for name, folder in models.items()
                if name in generative
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
    """One line for the run summary: test NDCG@10 with intervals, then each generative model
    against SASRec and against the best baseline (paired intervals)."""
    metric = headline_metric(report["ks"])
    parts = []
    for model, row in report["test"].items():
        ci = report["intervals"]["test"][model][metric]
        parts.append(f"{model} {row[metric]:.4f} [{ci['low']:.4f}, {ci['high']:.4f}]")
    line = f"test {metric.upper()}: " + " · ".join(parts)
    paired, baseline = report["paired"]["test"], report.get("best_baseline")
    for model in (m for m in report["test"] if m not in BASELINES):
        words = [
            f"{verdict(diff)} {name} ({_signed(diff)})"
            for name, diff in (
                ("sasrec", paired.get(f"{model} - sasrec", {}).get(metric)),
                (
                    f"the best baseline {baseline}",
                    paired.get(f"{model} - {BEST_BASELINE}", {}).get(metric),
                ),
            )
            if diff is not None and not (name.endswith(" sasrec") and baseline == "sasrec")
        ]
        if words:
            line += f" · {model} " + " and ".join(words)
    return line


def _signed(interval: dict[str, float]) -> str:
    return f"{interval['mean']:+.4f} [{interval['low']:+.4f}, {interval['high']:+.4f}]"


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
