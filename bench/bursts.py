"""Benchmark: how far apart in time a user's consecutive interactions are (rating bursts).

    python -m bench.bursts                          # in a folder where the split stage has run
    python -m bench.bursts --set project.data_dir=bench/runs/q/default/seed-0/data

Reads the split's train, valid and test rows and, per user, the targets' timestamps in the
split's order (timestamp, ties in file order). For each step from one target to the user's
next (train → train, last train → valid, valid → test) it prints the share of steps whose gap
is 0 seconds, at most a minute and at most an hour. Where most steps share a timestamp, the
order of the next few items is mostly the order the ratings were entered in; that is what
``grpo.horizon`` reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from bench.common import bench_args

LIMITS = (("same second", 0), ("<= 1 minute", 60), ("<= 1 hour", 3600))


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )


def step_gaps(splits: dict[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    """Seconds between each user's consecutive targets, by the kind of step: ``train → train``,
    ``train → valid`` (the newest train target to the valid one) and ``valid → test``."""
    frames = [
        df[["user_id", "timestamp"]].assign(split=name, _row=np.arange(len(df)))
        for name, df in splits.items()
    ]
    order = {name: n for n, name in enumerate(splits)}
    rows = pd.concat(frames, ignore_index=True)
    rows = rows.assign(_split=rows["split"].map(order)).sort_values(
        ["user_id", "_split", "timestamp", "_row"], kind="stable"
    )
    same_user = rows["user_id"].eq(rows["user_id"].shift())
    gap = rows["timestamp"].astype("int64").diff()
    kind = rows["split"].shift() + " → " + rows["split"]
    steps = pd.DataFrame({"kind": kind, "gap": gap})[same_user]
    return {k: g["gap"].to_numpy() for k, g in steps.groupby("kind", sort=False)}


def table(gaps: dict[str, np.ndarray]) -> str:
    """A markdown table: per kind of step, how many and the share within each limit."""
    head = "| step | steps | " + " | ".join(name for name, _ in LIMITS) + " |"
    lines = [head, "|---|---|" + "---|" * len(LIMITS)]
    for kind, values in gaps.items():
        shares = " | ".join(f"{np.mean(values <= limit):.1%}" for _, limit in LIMITS)
        lines.append(f"| {kind} | {len(values)} | {shares} |")
    return "\n".join(lines)


def main() -> None:
    args = bench_args(__doc__, _options)
    from sidrec.config import load_settings
    from tasks.shared.inputs import read_split

    settings = load_settings(args.params, args.overrides)
    splits = {name: read_split(settings, name) for name in ("train", "valid", "test")}
    print(f"{settings.project.dataset}: seconds between a user's consecutive targets\n")
    print(table(step_gaps(splits)))


if __name__ == "__main__":
    main()
