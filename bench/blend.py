"""Benchmark: SASRec, EASE and a blend of the two on the test users of finished runs.

    python -m bench.blend bench/runs/q/default/seed-0 bench/runs/q/default/seed-1 \\
        bench/runs/q/default/seed-2 [--models grpo sft]

GRPO's ``ease`` reward (``grpo.rewards.ease``) reads EASE (``models/baselines/ease.py``), the
catalog's item-to-item co-occurrences after a history read by recency. Whether that signal is
new to SASRec is measured here with no generative model at all, per run folder of
:mod:`bench.quality` (or :mod:`bench.experiments.variant`):

- SASRec: the run's own ``baselines`` model, as ``evaluate`` ranks with it;
- EASE, fitted on the run's train split with the run's ``grpo.ease_l2`` and
  ``grpo.ease_recency`` (or ``--l2`` / ``--recency``);
- the blend: per row, SASRec's log-probabilities and EASE's scores each standardized (mean 0,
  sd 1 over the catalog) and summed as ``sasrec + α · ease`` (``models.baselines.ease.blend``,
  which ``sft.distill_ease`` also teaches from), with α the value of ``--alphas``
  that scores best on the validation users' selection half (the gate half and test are never
  read to pick it).

Every model ranks the same test users with the same exclusions as ``evaluate`` (the user's
earlier items under ``evaluate.exclude_seen``). Prints test NDCG@10 per run, then, pooled over
the runs (each user's mean over them, as ``bench.quality`` pools seeds), EASE − SASRec and
blend − SASRec with paired bootstrap intervals and the blend / SASRec ratio. With ``--models``,
the run's own models (evaluate's per-user test scores, e.g. ``grpo``) join the table, and a
second table gives each one − blend and / blend.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd
import torch

from bench.common import bench_args, per_user_scores, run_settings

if TYPE_CHECKING:
    from sidrec.config import Settings

MODELS = ("sasrec", "ease", "blend")
ALPHAS = (0.0, 0.125, 0.25, 0.375, 0.5, 1.0)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="+", help="finished run folders (one split)")
    parser.add_argument("--l2", type=float, default=None, help="default: the run's grpo.ease_l2")
    parser.add_argument(
        "--recency", type=float, default=None, help="default: the run's grpo.ease_recency"
    )
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS))
    parser.add_argument(
        "--models",
        nargs="*",
        default=[],
        help="the run's own models (evaluate's per-user test scores) to compare with the blend",
    )


class RunScores(NamedTuple):
    """One run's test NDCG@10 per user and model, and the blend weight picked for it."""

    ndcg: pd.DataFrame
    """Index: user_id; columns: :data:`MODELS`."""
    alpha: float


def run_scores(
    settings: Settings,
    *,
    l2: float | None = None,
    recency: float | None = None,
    alphas: Sequence[float] = ALPHAS,
) -> RunScores:
    """Test NDCG@10 per user of SASRec, EASE and their blend in the run of ``settings`` (its
    splits, catalog and SASRec model)."""
    from models.baselines import catalog_index, encode_histories, encode_targets
    from models.baselines.blend import Rows, choose_alpha, ease_scorer, sasrec_scorer
    from models.baselines.ease import EASE, blend
    from models.baselines.sasrec import _pad_left, load_baseline
    from models.metrics import per_row_metrics, topk_from_scores
    from sidrec.protocol import validation_half
    from tasks.evaluate import exclusions
    from tasks.shared.inputs import load_catalog_and_map, read_split

    items, _ = load_catalog_and_map(settings)
    item_ids = [str(i) for i in items["item_id"]]
    index = catalog_index(item_ids)
    splits = {s: read_split(settings, s) for s in ("train", "valid", "test")}
    sasrec = load_baseline(settings.paths.sasrec_model, item_ids=item_ids)
    cfg = settings.grpo
    ease = EASE(
        item_ids=item_ids,
        l2=cfg.ease_l2 if l2 is None else l2,
        recency=cfg.ease_recency if recency is None else recency,
    ).fit(splits["train"])

    def scored(name: str, rows: pd.DataFrame):
        histories = [list(h) for h in rows["history"]]
        encoded = encode_histories(histories, index, f"{name} histories")
        with sasrec.inference():
            hidden = sasrec(_pad_left(encoded, sasrec.config.max_len))[:, -1]
            logp = sasrec.scores(hidden).float().log_softmax(-1).numpy()
        exclude = exclusions(settings, splits, name, rows)
        banned = None if exclude is None else encode_histories(exclude, index, "exclusions")
        targets = encode_targets(list(rows["target"]), index, f"{name} targets")

        def ndcg(values: torch.Tensor) -> np.ndarray:
            topk = topk_from_scores(values, 10, exclude=banned)
            return per_row_metrics(topk, targets, (10,))["ndcg@10"]

        return torch.from_numpy(logp), torch.from_numpy(ease.scores(encoded)), ndcg

    # α chosen as the baselines stage chooses it (ties: the smaller α)
    selection = validation_half(splits["valid"], "selection")
    seen = exclusions(settings, splits, "valid", selection)
    rows = Rows(
        histories=encode_histories([list(h) for h in selection["history"]], index, "histories"),
        targets=encode_targets(list(selection["target"]), index, "valid targets"),
        exclude=None if seen is None else encode_histories(seen, index, "exclusions"),
    )
    alpha = choose_alpha(
        sasrec=sasrec_scorer(sasrec), ease=ease_scorer(ease), alphas=sorted(alphas), rows=rows
    ).value
    test = splits["test"]
    sas, eas, ndcg = scored("test", test)
    frame = pd.DataFrame(
        {"sasrec": ndcg(sas), "ease": ndcg(eas), "blend": ndcg(blend(sas, eas, alpha))},
        index=test["user_id"].astype(str).to_numpy(),
    )
    return RunScores(frame, float(alpha))


def with_models(result: RunScores, run: Path, models: Sequence[str]) -> RunScores:
    """``result`` with a test NDCG@10 column per model of the run's own evaluation."""
    for model in models:
        if model in MODELS:
            raise ValueError(f"{model!r} is computed here; --models takes the run's other models")
    extra = [per_user_scores(run, "test", m, ["ndcg@10"])["ndcg@10"].rename(m) for m in models]
    frame = result.ndcg.join([e.set_axis(e.index.astype(str)) for e in extra], how="left")
    missing = frame[list(models)].isna().any(axis=1)
    if missing.any():
        from sidrec.errors import InputError

        raise InputError(
            f"{int(missing.sum())} test user(s) have no score of {', '.join(models)}", path=run
        )
    return result._replace(ndcg=frame)


def main() -> None:
    args = bench_args(__doc__, _options)
    from sidrec.errors import InputError

    scores = [
        with_models(
            run_scores(run_settings(run), l2=args.l2, recency=args.recency, alphas=args.alphas),
            run,
            args.models,
        )
        for run in args.runs
    ]
    users = scores[0].ndcg.index
    print("test NDCG@10 (α: the blend weight picked on the selection half)")
    print("| run | SASRec | EASE | blend | α |")
    print("|---|---|---|---|---|")
    for run, result in zip(args.runs, scores, strict=True):
        if set(result.ndcg.index) != set(users):
            raise InputError(
                "the runs scored different test users: use runs of one split", path=run
            )
        means = result.ndcg.mean()
        print(
            f"| {run} | {means['sasrec']:.4f} | {means['ease']:.4f} | {means['blend']:.4f} | "
            f"{result.alpha:g} |"
        )
    pooled = sum(result.ndcg.loc[users] for result in scores) / len(scores)
    base = pooled["sasrec"].to_numpy()
    print()
    print(f"pooled over {len(scores)} run(s), {len(users)} test users (each user's mean):")
    print("| model | NDCG@10 | − SASRec [95% paired bootstrap] | / SASRec [95%] |")
    print("|---|---|---|---|")
    for model in [*MODELS, *args.models]:
        values = pooled[model].to_numpy()
        if model == "sasrec":
            print(f"| sasrec | {values.mean():.4f} | | |")
            continue
        print(f"| {model} | {values.mean():.4f} | {_against(values, base)} |")

    if args.models:
        blend = pooled["blend"].to_numpy()
        print()
        print("| model | − blend [95% paired bootstrap] | / blend [95%] |")
        print("|---|---|---|")
        for model in args.models:
            print(f"| {model} | {_against(pooled[model].to_numpy(), blend)} |")


def _against(values: np.ndarray, base: np.ndarray) -> str:
    """Two table cells: ``values − base`` and ``values / base`` with their paired intervals."""
    from models.stats import paired_bootstrap_interval, paired_ratio_interval

    diff = paired_bootstrap_interval(values, base)
    ratio = paired_ratio_interval(values, base)
    return (
        f"{diff.mean:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}] | "
        f"{ratio.mean:.3f}× [{ratio.low:.3f}, {ratio.high:.3f}]"
    )


if __name__ == "__main__":
    main()
