"""Benchmark: paired comparison of models from two runs on the same split and users.

    python -m bench.experiments.compare /tmp/base /tmp/variant                 # sft of each run, test
    python -m bench.experiments.compare /tmp/base /tmp/variant --model grpo --split valid
    python -m bench.experiments.compare /tmp/base /tmp/variant --split selection   # after breakdown on both
    python -m bench.experiments.compare /tmp/base /tmp/base --model sft --model-b grpo
    python -m bench.experiments.compare base/seed-0 var/seed-0 base/seed-1 var/seed-1   # pooled over seeds

Reads ``metrics/eval_users.parquet`` of each run folder (written by ``evaluate``: one row per
split, model and user) and prints a markdown table: each model's mean NDCG@10 / HR@10 and the
paired bootstrap interval of the difference (B - A) over the users both runs scored. The runs
must come from the same split (the same users, the same targets): a copy of one pipeline
folder with one stage re-run is the intended use (docs/benchmarks.md). Several A B pairs (one
per seed, every seed on the same split) pool as ``bench.quality`` pools seeds: each user's
score is its mean over the pairs, and the interval is bootstrapped over users. With two or more
pairs it also says how much of that interval is the seeds' and how much the users' own
(``models.stats.seed_noise``): the half-width with endless seeds is the smallest difference
that more seeds could ever call a win on these users.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import bench_args, per_user_scores

METRICS = ("ndcg@10", "hr@10")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN_A RUN_B",
        help="folders (hold metrics/): A B [A B ...]",
    )
    parser.add_argument("--model", default="sft", help="model of run A (and of B by default)")
    parser.add_argument("--model-b", default=None, help="model of run B (default: --model)")
    parser.add_argument(
        "--split",
        default="test",
        choices=("valid", "test", "selection"),
        help="valid: its gate half (evaluate's); selection: the other half, as "
        "bench.experiments.breakdown scored it (the half settings are chosen on)",
    )
    parser.add_argument("--resamples", type=int, default=1000)


def main() -> None:
    args = bench_args(__doc__, _options)
    import pandas as pd

    from models.stats import paired_bootstrap_interval, seed_noise
    from sidrec.errors import InputError

    def scores(run: Path, model: str) -> pd.DataFrame:
        return per_user_scores(run, args.split, model, METRICS)

    if len(args.runs) % 2:
        raise InputError(f"runs come in pairs (A B [A B ...]); got {len(args.runs)} folders")
    model_b = args.model_b or args.model
    pairs = list(zip(args.runs[::2], args.runs[1::2], strict=True))
    tables = [scores(run, model_b if i % 2 else args.model) for i, run in enumerate(args.runs)]
    users = tables[0].index
    for run, table in zip(args.runs, tables, strict=True):
        if set(table.index) != set(users):
            raise InputError(
                f"the runs scored different {args.split} users ({len(table)} vs {len(users)}): "
                "compare runs of one split only",
                path=run,
            )
    a_runs, b_runs = tables[::2], tables[1::2]
    # each user's mean over the pairs (one pair: its scores)
    a = sum(t.loc[users] for t in a_runs) / len(pairs)
    b = sum(t.loc[users] for t in b_runs) / len(pairs)
    where = (
        f"A = {args.model} of {pairs[0][0]}, B = {model_b} of {pairs[0][1]}"
        if len(pairs) == 1
        else f"A = {args.model}, B = {model_b}, each user's mean over {len(pairs)} pairs "
        + ", ".join(f"({run_a}, {run_b})" for run_a, run_b in pairs)
    )
    print(f"{args.split}, {len(users)} users; {where}")
    print("| metric | A | B | B - A [95% paired bootstrap] |")
    print("|---|---|---|---|")
    for metric in METRICS:
        x, y = a[metric].to_numpy(), b[metric].to_numpy()
        ci = paired_bootstrap_interval(y, x, n_resamples=args.resamples)
        print(
            f"| {metric} | {x.mean():.4f} | {y.mean():.4f} | "
            f"{y.mean() - x.mean():+.4f} [{ci.low:+.4f}, {ci.high:+.4f}] |"
        )
    if len(pairs) > 1:
        print()
        for metric in METRICS:
            # users x pairs: each pair's B - A per user
            diffs = pd.concat(
                [
                    tb.loc[users, metric] - ta.loc[users, metric]
                    for ta, tb in zip(a_runs, b_runs, strict=True)
                ],
                axis=1,
            ).to_numpy()
            noise = seed_noise(diffs)
            print(
                f"{metric}: B - A ± {noise.half_width:.4f} with these {noise.seeds} pairs "
                f"(normal approximation of the interval above), ± {noise.half_width_endless:.4f} "
                "with endless seeds (the users' own spread: a smaller difference is noise on "
                "these users whatever the seeds)"
            )


if __name__ == "__main__":
    main()
