"""Benchmark: the SASRec baseline's settings (params.yaml's source, MovieLens-100k, unless
``--set ingest.source=…`` names another, whose dataset profile then applies), 2 CPU threads.

    python -m bench.sasrec                            # max_len 20 (= split.max_history) vs 50
    python -m bench.sasrec --max-len 20 --max-len 50 --set sasrec.patience=10
    python -m bench.sasrec --config "" --config "sasrec.hidden=128 sasrec.dropout=0.5" \\
        --seed 0 --seed 1 --seed 2 --output bench/runs/sasrec.json

Runs ingest → validate → split once per ``--seed`` (``project.seed``) in a temporary folder
with the repo's params.yaml, then the ``baselines`` stage once per ``--config`` (a space-
separated list of ``section.key=value`` overrides; "" = params.yaml as written; ``--max-len N``
is short for ``--config sasrec.max_len=N``): early stopping on the selection half of the
validation users, as ``make run`` trains it. Each saved model is loaded back and scored on
the gate half (users no checkpoint was selected on) and on test, over the full catalog, plain
and with the user's seen items excluded (as ``evaluate.exclude_seen`` does). Every model is
fed the split's histories, which hold at most ``split.max_history`` items.

Prints one markdown row per seed and config, then a summary per config: means over the seeds
and, against the first config, the paired difference of seen-excluded NDCG@10 on the gate half
(the basis for choosing a setting: validation users only) and on test (reported, never chosen
on), each a bootstrap over users of their mean over the seeds.
"""

from __future__ import annotations

import argparse
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import bench_args
from sidrec.config import Settings, load_settings
from sidrec.io import atomic_write_json

REPO = Path(__file__).resolve().parent.parent


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-len", type=int, action="append", dest="max_lens", default=[])
    parser.add_argument(
        "--config",
        action="append",
        dest="configs",
        default=[],
        help='space-separated section.key=value overrides of one setting ("" = params.yaml)',
    )
    parser.add_argument("--seed", type=int, action="append", dest="seeds", default=[])
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value (all)"
    )
    parser.add_argument("--output", type=Path, help="JSON file of every run's scores")


def configs_of(args: argparse.Namespace) -> list[list[str]]:
    """The settings to compare, each a list of overrides: ``--config`` then ``--max-len``."""
    configs = [shlex.split(c) for c in args.configs]
    configs += [[f"sasrec.max_len={n}"] for n in args.max_lens]
    return configs or [["sasrec.max_len=20"], ["sasrec.max_len=50"]]


def label_of(config: list[str]) -> str:
    """How a config reads in the tables: its overrides without the section, or "params.yaml"."""
    return " ".join(o.removeprefix("sasrec.") for o in config) or "params.yaml"


def score(settings: Settings) -> dict[str, Any]:
    """Per-row NDCG@10 / HR@10 of the saved SASRec on the gate half and on test, plain and
    seen-excluded, with each row's user."""
    from models.baselines import encode_targets
    from models.baselines.sasrec import load_baseline, recommend
    from models.metrics import per_row_metrics
    from sidrec.io import read_table
    from sidrec.protocol import seen_items, validation_half
    from sidrec.schemas import ITEMS, SPLIT

    paths = settings.paths
    item_ids = read_table(paths.validated("items"), ITEMS, "items")["item_id"].tolist()
    splits = {s: read_table(paths.split(s), SPLIT, s) for s in ("train", "valid", "test")}
    model = load_baseline(settings.paths.sasrec_model, item_ids=item_ids)
    rows = {"gate": validation_half(splits["valid"], "gate"), "test": splits["test"]}
    earlier = {"gate": [], "test": [splits["valid"]]}
    out: dict[str, Any] = {}
    for name, df in rows.items():
        targets = encode_targets(list(df["target"]), model.index, name)
        histories = [list(h) for h in df["history"]]
        seen = seen_items(splits["train"], df, earlier[name])
        out[f"{name} users"] = [str(u) for u in df["user_id"]]
        for label, exclude in (("", None), (" seen-excluded", seen)):
            topk = recommend(model, histories, 10, exclude=exclude)
            metrics = per_row_metrics(topk, targets, [10])
            out[f"{name}{label}"] = {k: v.tolist() for k, v in metrics.items()}
    return out


def _mean(values: list[float]) -> float:
    return float(np.mean(values))


def _user_means(runs: list[dict[str, Any]], half: str) -> tuple[list[str], np.ndarray]:
    """Each user's seen-excluded NDCG@10 on ``half``, averaged over the seeds' runs."""
    users = runs[0]["scores"][f"{half} users"]
    for run in runs[1:]:
        if run["scores"][f"{half} users"] != users:
            raise ValueError(f"the seeds' {half} users differ: cannot pair them")
    values = np.mean([r["scores"][f"{half} seen-excluded"]["ndcg@10"] for r in runs], axis=0)
    return users, values


def summary(results: list[dict[str, Any]], labels: list[str]) -> list[dict[str, Any]]:
    """Per config: means over seeds, and the paired gate / test difference against the first."""
    from models.stats import paired_bootstrap_interval

    by_label = {lab: [r for r in results if r["config"] == lab] for lab in labels}
    means = {lab: {h: _user_means(by_label[lab], h) for h in ("gate", "test")} for lab in labels}
    rows = []
    for lab in labels:
        runs = by_label[lab]
        row: dict[str, Any] = {
            "config": lab,
            "seeds": [r["seed"] for r in runs],
            "train_s": _mean([r["trained"]["seconds"] for r in runs]),
            "best_epoch": _mean([r["trained"]["best_epoch"] for r in runs]),
            "selection": _mean([r["trained"]["valid_selection"]["ndcg@10"] for r in runs]),
        }
        for half in ("gate", "test"):
            (users, values), (base_users, base) = means[lab][half], means[labels[0]][half]
            if users != base_users:
                raise ValueError(f"{lab}: other {half} users than {labels[0]}")
            row[half] = float(values.mean())
            if lab != labels[0]:
                iv = paired_bootstrap_interval(values, base)
                row[f"{half}_diff"] = {"mean": iv.mean, "low": iv.low, "high": iv.high}
        rows.append(row)
    return rows


def _diff(row: dict[str, Any], half: str) -> str:
    d = row.get(f"{half}_diff")
    return "" if d is None else f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def main() -> None:
    args = bench_args(__doc__, _options)
    from tasks.baselines import baselines
    from tasks.ingest import ingest
    from tasks.split import split
    from tasks.validate import validate

    configs = configs_of(args)
    labels = [label_of(c) for c in configs]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"--config: the same setting twice in {labels}")
    seeds = args.seeds or [None]
    output = None if args.output is None else args.output.resolve()  # before the chdir below
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for seed in seeds:
            work = Path(tmp) / f"seed-{seed}"
            base = [
                f"project.data_dir={work / 'data'}",
                f"project.metrics_dir={work / 'metrics'}",
                f"project.artifacts_dir={work / 'artifacts'}",
                f"project.runs_dir={work / 'runs'}",
                *([] if seed is None else [f"project.seed={seed}"]),
                *args.overrides,
            ]
            settings = load_settings(REPO / "params.yaml", base)
            for stage in (ingest, validate, split):
                stage(settings)
            for config, label in zip(configs, labels, strict=True):
                run = load_settings(REPO / "params.yaml", [*base, *config])
                trained = baselines(run).metrics
                results.append(
                    {
                        "seed": run.project.seed,
                        "config": label,
                        "trained": trained,
                        "scores": score(run),
                    }
                )

    first = results[0]["scores"]
    print(
        f"{settings.project.dataset}, {settings.split.method}, histories <= split.max_history = "
        f"{settings.split.max_history}; {args.threads} CPU threads; gate half "
        f"{len(first['gate users'])} users, test {len(first['test users'])} users"
    )
    print(
        "| seed | setting | windows | best epoch / run | train s | selection NDCG@10 "
        "| gate NDCG@10 | gate HR@10 | gate NDCG@10 (seen excl.) | test NDCG@10 "
        "| test NDCG@10 (seen excl.) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        m, s = r["trained"], r["scores"]
        print(
            f"| {r['seed']} | {r['config']} | {m['windows']:,} | {m['best_epoch']} / "
            f"{m['epochs_run']} | {m['seconds']:.1f} | {m['valid_selection']['ndcg@10']:.4f} | "
            f"{_mean(s['gate']['ndcg@10']):.4f} | {_mean(s['gate']['hr@10']):.4f} | "
            f"{_mean(s['gate seen-excluded']['ndcg@10']):.4f} | "
            f"{_mean(s['test']['ndcg@10']):.4f} | "
            f"{_mean(s['test seen-excluded']['ndcg@10']):.4f} |"
        )
    rows = summary(results, labels)
    print(
        f"\nmeans over seeds {rows[0]['seeds']}; NDCG@10 seen-excluded; differences against "
        f"{labels[0]}, paired bootstrap over users (95%)\n"
    )
    print(
        "| setting | best epoch | train s | selection | gate | gate − first | test | test − first |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['config']} | {row['best_epoch']:.1f} | {row['train_s']:.0f} | "
            f"{row['selection']:.4f} | {row['gate']:.4f} | {_diff(row, 'gate')} | "
            f"{row['test']:.4f} | {_diff(row, 'test')} |"
        )
    if output is not None:
        atomic_write_json(output, {"runs": results, "summary": rows})


if __name__ == "__main__":
    main()
