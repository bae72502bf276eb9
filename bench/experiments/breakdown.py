"""Experiment tool: each model's NDCG@10 on the validation selection half, by the user's
history length and by the target's popularity — the tables a setting is chosen with (never
test).

    python -m bench.experiments.breakdown RUN                           # every model of the run
    python -m bench.experiments.breakdown RUN --models sasrec blend sft --against blend
    python -m bench.experiments.breakdown RUN --cached                  # the scores it wrote last

RUN is a finished ``bench.quality`` (or ``bench.experiments.variant``) run folder. Its
selection half of the validation users (``sidrec/protocol.py``: the half that picks
checkpoints and settings) is ranked by every model as evaluate ranks its rows
(``tasks.evaluate.rank_rows``: the same exclusions, beams and models); the per-user scores go
to ``RUN/metrics/selection_users.parquet``, which ``bench.experiments.compare --split
selection`` pairs across runs. Per grouping it prints each bucket's users and each model's
mean NDCG@10, and each model minus ``--against`` (default: the first model) with its 95%
paired bootstrap interval over the bucket's users.

Groupings: ``history`` — the distinct items the user had before the target (their whole train
history, not cut at ``split.max_history``); ``target popularity`` — the target's interactions
in the train split (0: an item no training row holds).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.common import bench_args, run_settings
from models.stats import paired_bootstrap_interval
from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs

SPLIT = "selection"
METRIC = "ndcg@10"
SCORES_FILE = "selection_users.parquet"
"""The per-user scores of the selection half, in a run folder's ``metrics/``."""
GROUPINGS: dict[str, tuple[str, tuple[int, ...]]] = {
    "history": ("history_items", (0, 1, 4, 6, 11, 21, 51, 101, 201)),
    "target popularity": ("target_train_count", (0, 1, 5, 10, 20, 50, 100, 500)),
}
"""Grouping → (the per-user column it buckets, the buckets' lower edges)."""


def selection_users(settings: Settings, *, generative: bool) -> pd.DataFrame:
    """Every model's per-user scores on the selection half (evaluate's per-user columns, with
    ``split`` = "selection"), and per user ``history_items`` and ``target_train_count``."""
    from sidrec.protocol import seen_items, validation_half
    from tasks.evaluate import load_rankers, rank_rows
    from tasks.shared.inputs import load_catalog_and_map, read_split

    items, sid_map = load_catalog_and_map(settings)
    item_ids = items["item_id"].tolist()
    splits = {s: read_split(settings, s) for s in ("train", "valid")}
    rows = validation_half(splits["valid"], "selection")
    if rows.empty:
        raise InputError(
            "no validation row in the selection half", path=settings.paths.split("valid")
        )
    rankers = load_rankers(settings, item_ids, sid_map, splits["train"], generative=generative)
    _, users = rank_rows(settings, rankers, splits, SPLIT, rows)
    user_ids = rows["user_id"].astype(str).to_numpy()
    history = dict(zip(user_ids, (len(s) for s in seen_items(splits["train"], rows)), strict=True))
    counts = rankers.popularity.counts
    target = dict(
        zip(user_ids, (int(counts[rankers.index[t]]) for t in rows["target"]), strict=True)
    )
    users["history_items"] = users["user_id"].map(history)
    users["target_train_count"] = users["user_id"].map(target)
    return users


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """``(0, 1, 4)`` → ``["0", "1–3", "4+"]``."""
    labels = []
    for lo, hi in zip(edges, [*edges[1:], None], strict=True):
        if hi is None:
            labels.append(f"{lo}+")
        else:
            labels.append(str(lo) if hi - 1 == lo else f"{lo}–{hi - 1}")
    return labels


def breakdown(
    users: pd.DataFrame,
    column: str,
    edges: Sequence[int],
    models: Sequence[str],
    against: str,
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per non-empty bucket of ``column`` (then "all"): its users, their share, each
    model's mean NDCG@10 and each other model's paired difference to ``against`` with its 95%
    bootstrap interval (``low``, ``high``; None in a bucket of one user)."""
    scores = users.pivot(index="user_id", columns="model", values=METRIC)
    missing = [m for m in {*models, against} if m not in scores.columns]
    if missing:
        raise InputError(
            f"no selection scores of {', '.join(sorted(missing))} (these models ran: "
            f"{', '.join(scores.columns)})"
        )
    values = users.drop_duplicates("user_id").set_index("user_id")[column].loc[scores.index]
    bucket = np.searchsorted(np.asarray(edges), values.to_numpy(), side="right") - 1
    labels = bucket_labels(edges)
    groups = [(labels[b], bucket == b) for b in range(len(edges)) if (bucket == b).any()]
    rows = []
    for label, mask in [*groups, ("all", np.ones(len(scores), dtype=bool))]:
        part = scores[mask]
        row: dict[str, Any] = {
            "bucket": label,
            "users": int(mask.sum()),
            "share": float(mask.mean()),
            "ndcg@10": {m: float(part[m].mean()) for m in models},
            "minus": {},
        }
        for model in models:
            if model == against:
                continue
            a, b = part[model].to_numpy(), part[against].to_numpy()
            if len(part) < 2:  # one user: a difference, no interval
                row["minus"][model] = {
                    "diff": float(a.mean() - b.mean()),
                    "low": None,
                    "high": None,
                }
                continue
            ci = paired_bootstrap_interval(a, b, n_resamples=resamples, seed=seed)
            row["minus"][model] = {"diff": ci.mean, "low": ci.low, "high": ci.high}
        rows.append(row)
    return rows


def table(title: str, rows: list[dict[str, Any]], models: Sequence[str], against: str) -> str:
    others = [m for m in models if m != against]
    head = ["bucket", "users", "share", *models, *(f"{m} − {against} [95%]" for m in others)]
    lines = [f"**{title}** (NDCG@10, selection half)", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "---|" * len(head))
    for row in rows:
        cells = [row["bucket"], str(row["users"]), f"{row['share']:.1%}"]
        cells += [f"{row['ndcg@10'][m]:.4f}" for m in models]
        cells += [_difference(row["minus"][m]) for m in others]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _difference(d: dict[str, Any]) -> str:
    interval = "n/a" if d["low"] is None else f"{d['low']:+.4f}, {d['high']:+.4f}"
    return f"{d['diff']:+.4f} [{interval}]"


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="a finished run folder (holds metrics/)")
    parser.add_argument("--models", nargs="+", help="default: every model the run has")
    parser.add_argument(
        "--against", help="the model the differences are taken to (default: the first)"
    )
    parser.add_argument(
        "--cached", action="store_true", help=f"read metrics/{SCORES_FILE} instead of ranking"
    )
    parser.add_argument("--resamples", type=int, default=1000)


def main() -> None:
    args = bench_args(__doc__, _options)
    settings = run_settings(args.run)
    path = settings.paths.metrics_dir / SCORES_FILE
    if args.cached:
        if not path.exists():
            raise InputError("no selection scores yet; run without --cached first", path=path)
        users = pd.read_parquet(path)
    else:
        users = selection_users(settings, generative=settings.paths.sft_model.exists())
        with AtomicOutputs() as out:
            out.parquet(users, path)
    models = args.models or list(dict.fromkeys(users["model"]))
    against = args.against or models[0]
    if against not in models:
        models = [against, *models]
    print(f"{args.run}: {users['user_id'].nunique()} selection users")
    for title, (column, edges) in GROUPINGS.items():
        rows = breakdown(users, column, edges, models, against, resamples=args.resamples)
        print()
        print(table(f"by {title}", rows, models, against))


if __name__ == "__main__":
    from sidrec.errors import SidrecError

    try:
        main()
    except SidrecError as exc:
        raise SystemExit(f"error: {exc}") from None
