"""Benchmark: the SASRec baseline's history length on MovieLens-100k, 2 CPU threads.

    python -m bench.sasrec                            # max_len 20 (= split.max_history) vs 50
    python -m bench.sasrec --max-len 20 --max-len 50 --set sasrec.patience=10

Runs ingest → validate → split in a temporary folder with the repo's params.yaml, then the
``baselines`` stage once per ``--max-len`` (training windows of that many transitions, early
stopping on the selection half of the validation users), loads each saved model back and
scores it on the gate half (the users no checkpoint was selected on) and on test. Every
model is fed the split's histories, which hold at most ``split.max_history`` items.
Prints a markdown table: NDCG@10 / HR@10 over the full catalog, plain and with the user's
seen items excluded (as ``evaluate.exclude_seen`` does), and the training time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.common import bench_args
from sidrec.config import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-len", type=int, action="append", dest="max_lens")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )


def score(settings: Settings) -> dict[str, dict[str, float]]:
    """NDCG@10 / HR@10 of the saved SASRec on the gate half and on test, plain and seen-excluded."""
    from models.baselines import encode_targets
    from models.baselines.sasrec import load_baseline, recommend
    from models.metrics import rank_metrics
    from sidrec.io import read_table
    from sidrec.protocol import seen_items, validation_half
    from sidrec.schemas import ITEMS, SPLIT

    paths = settings.paths
    item_ids = read_table(paths.validated("items"), ITEMS, "items")["item_id"].tolist()
    splits = {s: read_table(paths.split(s), SPLIT, s) for s in ("train", "valid", "test")}
    model = load_baseline(settings.paths.sasrec_model, item_ids=item_ids)
    rows = {"gate": validation_half(splits["valid"], "gate"), "test": splits["test"]}
    earlier = {"gate": [], "test": [splits["valid"]]}
    out = {}
    for name, df in rows.items():
        targets = encode_targets(list(df["target"]), model.index, name)
        histories = [list(h) for h in df["history"]]
        seen = seen_items(splits["train"], df, earlier[name])
        for label, exclude in (("", None), (" seen-excluded", seen)):
            metrics = rank_metrics(recommend(model, histories, 10, exclude=exclude), targets, [10])
            out[f"{name}{label}"] = {"ndcg@10": metrics["ndcg@10"], "hr@10": metrics["hr@10"]}
    out["rows"] = {"gate": len(rows["gate"]), "test": len(rows["test"])}
    return out


def main() -> None:
    args = bench_args(__doc__, _options)
    from tasks.baselines import baselines
    from tasks.ingest import ingest
    from tasks.split import split
    from tasks.validate import validate

    max_lens = args.max_lens or [20, 50]
    results: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.chdir(work)
        base = [
            f"project.data_dir={work / 'data'}",
            f"project.metrics_dir={work / 'metrics'}",
            f"project.artifacts_dir={work / 'artifacts'}",
            *args.overrides,
        ]
        settings = load_settings(REPO / "params.yaml", base)
        for stage in (ingest, validate, split):
            stage(settings)
        for max_len in max_lens:
            run = load_settings(REPO / "params.yaml", [*base, f"sasrec.max_len={max_len}"])
            trained = baselines(run).metrics
            results.append((max_len, trained, score(run)))

    rows = results[0][2]["rows"]
    print(
        f"MovieLens-100k, {settings.split.method}, histories <= split.max_history = "
        f"{settings.split.max_history}; {args.threads} CPU threads; seed {settings.project.seed}; "
        f"gate half {rows['gate']} users, test {rows['test']} users"
    )
    print(
        "| max_len | windows | best epoch / run | train s | selection NDCG@10 | gate NDCG@10 "
        "| gate HR@10 | gate NDCG@10 (seen excl.) | test NDCG@10 | test NDCG@10 (seen excl.) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for max_len, m, s in results:
        print(
            f"| {max_len} | {m['windows']:,} | {m['best_epoch']} / {m['epochs_run']} | "
            f"{m['seconds']:.1f} | {m['valid_selection']['ndcg@10']:.4f} | "
            f"{s['gate']['ndcg@10']:.4f} | {s['gate']['hr@10']:.4f} | "
            f"{s['gate seen-excluded']['ndcg@10']:.4f} | {s['test']['ndcg@10']:.4f} | "
            f"{s['test seen-excluded']['ndcg@10']:.4f} |"
        )


if __name__ == "__main__":
    main()
