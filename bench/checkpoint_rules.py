"""Benchmark: two SFT checkpoint rules, judged from ``bench.checkpoints`` folders.

    python -m bench.checkpoint_rules bench/runs/base/default/seed-0 bench/runs/base/default/seed-6

Reads each folder's ``checkpoint-scores.json`` (``bench.checkpoints``: per-user NDCG@10 of the
validation gate half and of the test users at every validation, and which validation training
kept) and compares two rules: "best", the validation training kept (the best selection-half
NDCG@10, today's rule under ``sft.patience: null``), and "last", the last validation (what
``sft.eval_every`` equal to ``sft.epochs`` keeps: one validation, at the end). Validations do
not change the weights training reaches (tests/test_sft_objectives.py), so one run shows both.

Prints per folder and pooled over the folders (each user's score its mean over them; the
interval bootstrapped over users, as ``bench.compare`` pools seeds) the mean NDCG@10 of each
rule and the paired 95% interval of last − best, for the gate half (never used to select: it
judges the rule) and for test (reported beside it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import bench_args

SCORES = "checkpoint-scores.json"
PARTS = ("gate", "test")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folders", type=Path, nargs="+", help="bench.checkpoints --out folders")
    parser.add_argument("--resamples", type=int, default=1000)


def rule_scores(folder: Path) -> dict[str, Any]:
    """Per part (gate, test), the per-user NDCG@10 of the kept and of the last validation, and
    the epochs they are at."""
    from sidrec.errors import InputError

    path = folder / SCORES
    if not path.exists():
        raise InputError(
            "no checkpoint scores; run `python -m bench.checkpoints --out` there first", path=path
        )
    record = json.loads(path.read_text())
    kept = int(record["kept"])
    out: dict[str, Any] = {"kept_epoch": record["epochs"][kept], "last_epoch": record["epochs"][-1]}
    for part in PARTS:
        validations = record[part]
        out[part] = {
            "best": np.asarray(validations[kept]["per_user_ndcg@10"], dtype=np.float64),
            "last": np.asarray(validations[-1]["per_user_ndcg@10"], dtype=np.float64),
        }
    return out


def compare(best: np.ndarray, last: np.ndarray, resamples: int) -> str:
    from models.stats import paired_bootstrap_interval

    ci = paired_bootstrap_interval(last, best, n_resamples=resamples)
    return f"{best.mean():.4f} | {last.mean():.4f} | {ci.mean:+.4f} [{ci.low:+.4f}, {ci.high:+.4f}]"


def table(folders: list[Path], resamples: int) -> list[str]:
    from sidrec.errors import InputError

    runs = [rule_scores(f) for f in folders]
    for part in PARTS:
        sizes = {len(r[part]["best"]) for r in runs}
        if len(sizes) > 1:
            raise InputError(
                f"the folders score different {part} users ({sorted(sizes)} rows): pool only "
                "runs of one split"
            )
    head = " | ".join(f"{p} best | {p} last | {p} last − best" for p in PARTS)
    lines = [
        f"| folder | epoch kept / last | {head} |",
        "|---|---|" + "---|" * (3 * len(PARTS)),
    ]
    for folder, run in zip(folders, runs, strict=True):
        cells = " | ".join(compare(run[p]["best"], run[p]["last"], resamples) for p in PARTS)
        lines.append(f"| {folder} | {run['kept_epoch']:g} / {run['last_epoch']:g} | {cells} |")
    if len(runs) > 1:
        pooled = " | ".join(
            compare(
                np.mean([r[p]["best"] for r in runs], axis=0),
                np.mean([r[p]["last"] for r in runs], axis=0),
                resamples,
            )
            for p in PARTS
        )
        lines.append(f"| pooled ({len(runs)}) | | {pooled} |")
    return lines


def main() -> None:
    args = bench_args(__doc__, _options)
    print("\n".join(table(args.folders, args.resamples)))


if __name__ == "__main__":
    main()
