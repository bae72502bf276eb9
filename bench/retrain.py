"""Benchmark: a full retrain against an immediate no-op re-run (same data, same params).

    python -m bench.retrain                      # MovieLens-100k with the repo's params.yaml
    python -m bench.retrain --tiny               # a generated 30-item catalog, tiny settings (~1 min)
    python -m bench.retrain --set sft.epochs=1   # any params.yaml key, as `sidrec pipeline --set`

Runs the ``retrain`` flow twice in a temporary folder with a fresh Prefect home (the
ephemeral local API; its start-up is excluded by a warm-up flow) and a fresh MLflow
database, then prints the seconds of both runs, their ratio, and how many output files
the second run rewrote. Target (issue 6): the no-op run takes <= 10 % of the full one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import OUTPUT_DIRS, REPO, bench_args, folder_overrides
from sidrec.stage import STAGES


def tiny_project_overrides(root: Path) -> list[str]:
    """A CSV dataset under ``root/src`` (30 items, 24 users × 8 interactions, item i followed
    by i + 1) and the overrides that run every stage on it in seconds."""
    n_items, n_users, per_user = 30, 24, 8
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    rows = [
        f"u{u},i{(u + k) % n_items},{1_600_000_000 + 1000 * u + k}"
        for u in range(n_users)
        for k in range(per_user)
    ]
    (src / "interactions.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    titles = [f"i{n},Item {n} in group {n % 5}" for n in range(n_items)]
    (src / "items.csv").write_text("item_id,title\n" + "\n".join(titles) + "\n")
    sections: dict[str, dict[str, Any]] = {
        "project": {"dataset": "tiny"},
        "ingest": {
            "source": "csv",
            "interactions": str(src / "interactions.csv"),
            "items": str(src / "items.csv"),
        },
        # hybrid SIDs (the default) need fewer factors than the 24 users
        "sids": {"method": "rqkmeans", "levels": 2, "codebook_size": 8, "collaborative_dim": 8},
        "model": {
            "max_length": 128,
            "tiny": {"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64},
        },
        # windows of 8 items x (2 SID tokens + EOS) + BOS fit max_length 128; plain windows (the
        # default stride, 25, is longer than these)
        "sft": {
            "epochs": 1,
            "batch_size": 16,
            "window": 8,
            "window_stride": None,
            "eval_rows": 20,
            "logging_steps": 5,
        },
        "grpo": {
            "num_generations": 4,
            "prompts_per_step": 2,
            "max_steps": 2,
            "eval_every": 2,
            "eval_users": 8,
            "log_samples_every": 2,
            "sample_rows": 1,
        },
        "sasrec": {"max_epochs": 2},
        "evaluate": {"ks": [1, 5, 10], "num_beams": 10, "batch_size": 8},
        "register": {"top_k": 5},
    }
    return [
        f"{section}.{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"
        for section, values in sections.items()
        for key, value in values.items()
    ]


def snapshot(root: Path) -> dict[Path, int]:
    """Output file → modification time (ns), to count what a run rewrote."""
    return {
        path: path.stat().st_mtime_ns
        for folder in OUTPUT_DIRS
        for path in (root / folder).rglob("*")
        if path.is_file()
    }


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="a generated 30-item dataset with tiny settings"
    )
    parser.add_argument("--until", choices=STAGES, default=STAGES[-1], help="last stage to run")


def main() -> None:
    args = bench_args(__doc__, _options)
    with tempfile.TemporaryDirectory(prefix="sidrec-bench-retrain-") as tmp:
        work = Path(tmp)
        # before Prefect is imported: its home (ephemeral database, cached task results)
        # and MLflow's database start empty, so the first run computes everything
        os.environ["PREFECT_HOME"] = str(work / "prefect")
        os.environ.pop("PREFECT_API_URL", None)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        os.chdir(work)
        overrides = [
            *folder_overrides(work),
            *(tiny_project_overrides(work) if args.tiny else []),
            *args.overrides,
        ]
        from prefect import flow

        from flows.retrain import retrain
        from sidrec.config import load_settings

        settings = load_settings(REPO / "params.yaml", overrides)  # fail fast on a bad --set

        @flow(name="warm-up")
        def warm_up() -> None:
            """Starts the ephemeral API, so that neither timing includes its start-up."""

        warm_up()

        seconds = []
        for _ in range(2):
            before = snapshot(work)
            started = time.perf_counter()
            retrain(config_path=str(REPO / "params.yaml"), overrides=overrides, until=args.until)
            seconds.append(time.perf_counter() - started)
            after = snapshot(work)
        rewritten = sorted(p.relative_to(work) for p, t in after.items() if before.get(p) != t)

    full, noop = seconds
    print(
        f"dataset {settings.project.dataset} ({'generated, tiny settings' if args.tiny else 'params.yaml'}), "
        f"stages ingest → {args.until}, {args.threads} CPU threads, Prefect ephemeral API "
        f"(start-up excluded)\n"
    )
    print("| dataset | full s | no-op s | no-op / full | files rewritten by no-op |")
    print("|---|---|---|---|---|")
    print(
        f"| {settings.project.dataset} | {full:.1f} | {noop:.1f} | {noop / full:.1%} "
        f"| {len(rewritten)} |"
    )
    if rewritten:
        print("\nrewritten by the no-op run:", ", ".join(map(str, rewritten)))
    print(f"\ntarget: no-op <= 10% of full: {'met' if noop <= 0.1 * full else 'NOT met'}")


if __name__ == "__main__":
    main()
