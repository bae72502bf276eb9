"""Benchmark: how much each trained model reads the most recent item of a history.

    python -m bench.recency                       # in a folder where `make run` has run
    python -m bench.recency --set sft.window=20 --set sft.window_stride=10   # the run's overrides
    python -m bench.recency --run bench/runs/q/default/seed-0   # a bench.quality run folder

Scores the test rows twice with the folder's trained models (SASRec, SFT and, where it ran,
GRPO), ranked as ``evaluate`` ranks them (the shared recommender, its beams, the user's seen
items excluded under ``evaluate.exclude_seen``): once with each row's history as the split
gives it, once without its last item (for leave-one-out test rows that item is the valid
target). The exclusions and targets stay the same. A model that reads recency loses NDCG@10
when the last item goes; one that does not, loses nothing. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bench.common import bench_args

if TYPE_CHECKING:
    from models.recommender import SidRecommender
    from sidrec.config import Settings


class Recency(NamedTuple):
    rows: int
    """Test rows scored."""
    ndcg10: dict[str, tuple[float, float]]
    """Per trained model (``sasrec``, ``sft``, ``grpo`` where it ran): test NDCG@10 with each
    row's whole history, and without its last item."""


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument(
        "--run",
        type=Path,
        default=None,
        help="a finished bench.quality run folder: its models, with its own settings (--params "
        "is then not read; --set still comes last)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )


def _generative_top10(
    rec: SidRecommender, histories: list[list[str]], *, exclude: list[list[str]] | None
) -> np.ndarray:
    return rec.rank(histories, 10, exclude=exclude).items


def recency(settings: Settings) -> Recency:
    """The test rows scored by every trained model of ``settings``' folders, as evaluate ranks
    them, with and without their last history item."""
    from models.baselines.sasrec import load_baseline, recommend
    from models.metrics import rank_metrics
    from tasks.evaluate import exclusions
    from tasks.shared.inputs import load_catalog_and_map, load_recommender, read_split

    paths = settings.paths
    items, sid_map = load_catalog_and_map(settings)
    item_ids = items["item_id"].tolist()
    index = {item: row for row, item in enumerate(item_ids)}
    splits = {name: read_split(settings, name) for name in ("train", "valid", "test")}
    test = splits["test"]
    exclude = exclusions(settings, splits, "test", test)
    targets = np.asarray([index[t] for t in test["target"]])
    histories = {"full": [list(h) for h in test["history"]]}
    histories["without last"] = [h[:-1] for h in histories["full"]]

    sasrec = load_baseline(paths.sasrec_model, item_ids=item_ids)
    rankers: dict[str, Callable[[list[list[str]]], np.ndarray]] = {
        "sasrec": lambda h: recommend(sasrec, h, 10, exclude=exclude)
    }
    folders = {"sft": paths.sft_model, "grpo": paths.grpo_model}
    for name, folder in folders.items():
        if name == "grpo" and not (settings.grpo.enabled and folder.exists()):
            continue
        rec = load_recommender(settings, folder, sid_map, item_ids, missing_hint="run it first")
        rankers[name] = partial(_generative_top10, rec, exclude=exclude)
    full, cut = (
        {
            name: rank_metrics(rank(histories[key]), targets, [10])["ndcg@10"]
            for name, rank in rankers.items()
        }
        for key in ("full", "without last")
    )
    return Recency(len(test), {name: (full[name], cut[name]) for name in rankers})


def main() -> None:
    args = bench_args(__doc__, _options)
    from bench.common import run_settings
    from sidrec.config import load_settings
    from sidrec.errors import SidrecError

    try:
        if args.run is not None:
            settings = run_settings(args.run, args.overrides)
        else:
            settings = load_settings(args.params, args.overrides)
        result = recency(settings)
    except SidrecError as exc:
        sys.exit(f"error: {exc}")
    print(
        f"{settings.project.dataset}: {result.rows} test rows, seen items "
        f"excluded: {settings.evaluate.exclude_seen}, {settings.evaluate.num_beams} beams, "
        f"{args.threads} CPU threads"
    )
    print("| model | test NDCG@10, full history | without its last item | change |")
    print("|---|---|---|---|")
    for name, (full, cut) in result.ndcg10.items():
        print(f"| {name} | {full:.4f} | {cut:.4f} | {(cut - full) / full:+.1%} |")


if __name__ == "__main__":
    main()
