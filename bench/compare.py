"""Benchmark: paired comparison of models from two runs on the same split and users.

    python -m bench.compare /tmp/base /tmp/variant                 # sft of each run, test
    python -m bench.compare /tmp/base /tmp/variant --model grpo --split valid
    python -m bench.compare /tmp/base /tmp/base --model sft --model-b grpo

Reads ``metrics/eval_users.parquet`` of each run folder (written by ``evaluate``: one row per
split, model and user) and prints a markdown table: each model's mean NDCG@10 / HR@10 and the
paired bootstrap interval of the difference (B - A) over the users both runs scored. The runs
must come from the same split (the same users, the same targets): a copy of one pipeline
folder with one stage re-run is the intended use (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import bench_args

METRICS = ("ndcg@10", "hr@10")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path, help="folder of run A (holds metrics/)")
    parser.add_argument("run_b", type=Path, help="folder of run B")
    parser.add_argument("--model", default="sft", help="model of run A (and of B by default)")
    parser.add_argument("--model-b", default=None, help="model of run B (default: --model)")
    parser.add_argument("--split", default="test", choices=("valid", "test"))
    parser.add_argument("--resamples", type=int, default=1000)


def main() -> None:
    args = bench_args(__doc__, _options)
    import pandas as pd

    from models.stats import paired_bootstrap_interval
    from sidrec.errors import InputError

    def scores(run: Path, model: str) -> pd.DataFrame:
        path = run / "metrics" / "eval_users.parquet"
        if not path.exists():
            raise InputError("no per-user scores; run `sidrec evaluate` there first", path=path)
        table = pd.read_parquet(path)
        rows = table[(table["split"] == args.split) & (table["model"] == model)]
        if rows.empty:
            raise InputError(f"no {args.split} rows of model {model!r}", path=path)
        return rows.set_index("user_id")

    model_b = args.model_b or args.model
    a, b = scores(args.run_a, args.model), scores(args.run_b, model_b)
    if set(a.index) != set(b.index):
        raise InputError(
            f"the runs scored different {args.split} users ({len(a)} vs {len(b)}): "
            "compare runs of one split only",
            path=args.run_b,
        )
    b = b.loc[a.index]
    print(
        f"{args.split}, {len(a)} users; A = {args.model} of {args.run_a}, B = {model_b} of {args.run_b}"
    )
    print("| metric | A | B | B - A [95% paired bootstrap] |")
    print("|---|---|---|---|")
    for metric in METRICS:
        x, y = a[metric].to_numpy(), b[metric].to_numpy()
        ci = paired_bootstrap_interval(y, x, n_resamples=args.resamples)
        print(
            f"| {metric} | {x.mean():.4f} | {y.mean():.4f} | "
            f"{y.mean() - x.mean():+.4f} [{ci.low:+.4f}, {ci.high:+.4f}] |"
        )


if __name__ == "__main__":
    main()
