"""Benchmark: how sharp SASRec's item distribution is, the soft targets of ``sft.distill``.

    python -m bench.teacher --run bench/runs/quality/default/seed-0
    python -m bench.teacher --run RUN --temperatures 0.5 1 2 --rows 3000

Loads a finished run folder's SASRec (the ``baselines`` stage) and scores a sample of train,
valid and test rows from their histories (the last ``max_len`` items; those items removed, as
the teacher removes a window's earlier items). Per split and temperature it prints the mean
probability of the true next item, the mean top-1 probability, the mean entropy (nats; e^H is
the number of equally likely items it equals) and HR@10. Train rows are in-sample for SASRec.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import bench_args


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=Path, required=True, help="a finished run folder")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--rows", type=int, default=3000, help="rows sampled per split")


def main() -> None:
    args = bench_args(__doc__, _options)
    import torch

    from bench.common import folder_settings
    from models.baselines.sasrec import _pad_left, load_baseline
    from tasks.shared.inputs import load_catalog_and_map, read_split

    settings = folder_settings(args.run.resolve())
    items, _ = load_catalog_and_map(settings)
    sasrec = load_baseline(settings.paths.sasrec_model, item_ids=items["item_id"].tolist())
    index = {item: row for row, item in enumerate(sasrec.item_ids)}
    max_len = sasrec.config.max_len
    print(f"{args.run}: SASRec over {sasrec.n_items} items, histories of <= {max_len}")
    print("| split | rows | T | p(true item) | top-1 p | entropy (e^H items) | HR@10 |")
    print("|---|---|---|---|---|---|---|")
    for split in ("train", "valid", "test"):
        rows = read_split(settings, split)
        rows = rows.sample(n=min(args.rows, len(rows)), random_state=0)
        rows = rows[rows["history"].map(len) > 0]
        histories = [[index[str(i)] for i in h][-max_len:] for h in rows["history"]]
        target = torch.tensor([index[str(t)] for t in rows["target"]])
        with torch.no_grad(), sasrec.inference():
            scores = sasrec.scores(sasrec(_pad_left(histories, max_len))[:, -1]).float()
        for row, history in enumerate(histories):
            scores[row, history] = float("-inf")
        hit = (scores > scores.gather(1, target[:, None])).sum(1) < 10
        for temperature in args.temperatures:
            p = (scores / temperature).softmax(-1)
            entropy = -(p * p.clamp_min(1e-12).log()).sum(1).mean()
            print(
                f"| {split} | {len(rows)} | {temperature:g} "
                f"| {p.gather(1, target[:, None]).mean():.4f} | {p.max(1).values.mean():.4f} "
                f"| {entropy:.2f} ({entropy.exp():.0f}) | {hit.float().mean():.3f} |"
            )


if __name__ == "__main__":
    main()
