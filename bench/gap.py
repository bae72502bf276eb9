"""Benchmark: where each model loses between the valid gate users and the test users.

    python -m bench.gap                         # in a folder where `make run` (or evaluate) ran
    python -m bench.gap --run /tmp/base --quantiles 4

Reads the folder's per-user scores (``metrics/eval_users.parquet``, written by ``evaluate``:
the gate half of the validation users and every test user) and its train split, groups users
by how many train interactions they have (quantiles), and prints each model's mean NDCG@10 on
valid (gate) and on test per group, with its ratio to SASRec's. A valid row's history is the
end of the train sequence the models trained on; a test row's newest item (the valid target)
was never in training, so a model that leans on what it memorized of a user keeps its valid
score and loses on test, most where a user has the most history to memorize.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import bench_args

METRIC = "ndcg@10"


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=Path, default=Path("."), help="the run folder")
    parser.add_argument("--params", type=Path, default=None, help="default: RUN/params.yaml")
    parser.add_argument("--quantiles", type=int, default=4, help="user groups by train length")


def main() -> None:
    args = bench_args(__doc__, _options)
    import pandas as pd

    from sidrec.config import load_settings
    from sidrec.errors import InputError
    from sidrec.io import read_table
    from sidrec.schemas import SPLIT

    settings = load_settings(args.params or args.run / "params.yaml")
    scores_path = args.run / "metrics" / "eval_users.parquet"
    if not scores_path.exists():
        raise InputError("no per-user scores; run `sidrec evaluate` there first", path=scores_path)
    scores = pd.read_parquet(scores_path)
    train = read_table(args.run / settings.paths.split("train"), SPLIT, "train split")
    lengths = train.groupby("user_id").size().rename("train_items")
    table = scores.pivot_table(index=["split", "user_id"], columns="model", values=METRIC)
    table = table.reset_index().merge(lengths, left_on="user_id", right_index=True)
    table["group"] = pd.qcut(table["train_items"], args.quantiles, duplicates="drop")
    models = [m for m in ("sasrec", "sft", "grpo") if m in table.columns]

    generative = [m for m in models if m != "sasrec"]
    header = ["train items", "users valid / test", "SASRec valid / test"]
    header += [f"{m.upper()} valid / test (× SASRec)" for m in generative]
    print(f"{METRIC} by train-sequence length; {args.run}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    groups = [*table["group"].cat.categories, None]
    for group in groups:
        rows = table if group is None else table[table["group"] == group]
        mean = rows.groupby("split")[models].mean()
        count = rows.groupby("split").size()
        label = "all" if group is None else f"{group.left:.0f}–{group.right:.0f}"
        cells = [label, f"{count['valid']} / {count['test']}"]
        cells.append(f"{mean.loc['valid', 'sasrec']:.4f} / {mean.loc['test', 'sasrec']:.4f}")
        for m in generative:
            ratios = mean[m] / mean["sasrec"]
            cells.append(
                f"{mean.loc['valid', m]:.4f} / {mean.loc['test', m]:.4f} "
                f"({ratios['valid']:.2f} / {ratios['test']:.2f})"
            )
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
