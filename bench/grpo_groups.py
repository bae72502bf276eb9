"""Benchmark: what GRPO's beam groups hold at its SFT start, the user's own future included.

    python -m bench.grpo_groups --run bench/runs/q/default/seed-0
    python -m bench.grpo_groups --run RUN --run RUN2 ...      # pooled over run folders

For every GRPO training prompt of a finished run (``grpo.rows_per_user``: each user's newest
train rows, as :func:`tasks.grpo.training_rows` builds them), the SFT model's best
``grpo.num_generations`` items, as a beam rollout draws them (the shared recommender at that
beam width, the user's earlier items excluded). Per prompt age (0 = the user's newest train
row) it reports how often the group holds the row's target, one of the user's later train
targets, the user's valid target and the user's test target. Every item of a group other than
the target is "wrong" to the rule and ranking rewards and pushed down by its beam rank; the
later targets, valid and test among them are items the user did go on to choose. Reading
valid and test here is analysis only: no stage reads them for training.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import bench_args

if TYPE_CHECKING:
    from sidrec.config import Settings

COLUMNS = ("target", "a later train target", "valid target", "test target")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run",
        dest="runs",
        type=Path,
        action="append",
        required=True,
        help="a finished bench.quality run folder (repeatable)",
    )


def rollout_settings(folder: Path) -> Settings:
    """The settings of the finished run in ``folder``, ranking at the rollout's beam width
    (``evaluate.ks`` cut to fit it; nothing is evaluated here)."""
    from bench.common import run_settings

    g = run_settings(folder).grpo.num_generations
    return run_settings(folder, [f"evaluate.num_beams={g}", f"evaluate.ks=[1,10,{g}]"])


def group_contents(settings: Settings) -> dict[int, dict[str, Any]]:
    """Per prompt age: the number of prompts and, per column of :data:`COLUMNS`, how many of
    their groups (the SFT model's top ``grpo.num_generations`` at ``settings``' beam width)
    hold that item."""
    from sidrec.protocol import items_after, items_before
    from tasks.shared.inputs import load_catalog_and_map, load_recommender, read_split, recent_rows

    g = settings.grpo.num_generations
    items, sid_map = load_catalog_and_map(settings)
    item_ids = items["item_id"].tolist()
    train, valid, test = (read_split(settings, name) for name in ("train", "valid", "test"))
    per_user = settings.grpo.rows_per_user
    rows = recent_rows(train, per_user) if per_user != 0 else train.iloc[:0]
    exclude = items_before(train, rows) if settings.evaluate.exclude_seen else None
    rec = load_recommender(
        settings, settings.paths.sft_model, sid_map, item_ids, missing_hint="run sft first"
    )
    groups = rec.rank([list(h) for h in rows["history"]], g, exclude=exclude).items
    later = items_after(train, rows, len(train))  # the target, then every later train target
    valid_of = dict(zip(valid["user_id"], valid["target"], strict=True))
    test_of = dict(zip(test["user_id"], test["target"], strict=True))
    index = {item: n for n, item in enumerate(item_ids)}
    age = rows.groupby("user_id", sort=False).cumcount(ascending=False).to_numpy()
    out: dict[int, dict[str, Any]] = {}
    for n, (user, target) in enumerate(zip(rows["user_id"], rows["target"], strict=True)):
        group = set(groups[n].tolist())
        found = {
            "target": index[target] in group,
            "a later train target": any(index[t] in group for t in later[n][1:]),
            "valid target": user in valid_of and index[valid_of[user]] in group,
            "test target": user in test_of and index[test_of[user]] in group,
        }
        counts = out.setdefault(int(age[n]), {"prompts": 0} | dict.fromkeys(COLUMNS, 0))
        counts["prompts"] += 1
        for column, hit in found.items():
            counts[column] += int(hit)
    return dict(sorted(out.items()))


def pooled(results: list[dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """The per-age counts of several runs added up."""
    total: dict[int, dict[str, Any]] = {}
    for result in results:
        for age, counts in result.items():
            into = total.setdefault(age, dict.fromkeys(counts, 0))
            for key, value in counts.items():
                into[key] += value
    return dict(sorted(total.items()))


def table(counts: dict[int, dict[str, Any]]) -> list[str]:
    """Markdown rows: per prompt age, the share of groups holding each item."""
    lines = ["| prompt age | prompts | " + " | ".join(COLUMNS) + " |"]
    lines.append("|---" * (2 + len(COLUMNS)) + "|")
    for age, c in counts.items():
        shares = [f"{c[col] / max(1, c['prompts']):.1%}" for col in COLUMNS]
        lines.append(f"| {age} | {c['prompts']} | " + " | ".join(shares) + " |")
    return lines


def main() -> None:
    args = bench_args(__doc__, _options)
    from sidrec.errors import SidrecError

    try:
        results = [group_contents(rollout_settings(folder)) for folder in args.runs]
    except SidrecError as exc:
        sys.exit(f"error: {exc}")
    names = ", ".join(str(f) for f in args.runs)
    print(f"GRPO's beam groups at the SFT start, {names}; share of groups holding each item\n")
    print("\n".join(table(pooled(results))))


if __name__ == "__main__":
    main()
