"""Benchmark: the whole default pipeline on MovieLens-100k, stage by stage, and its eval table.

    python -m bench.pipeline        # or: make bench

Runs every stage function in order (as `make run` does, without the Prefect server) in a
temporary folder with the repo's params.yaml and a cold embedding cache, then prints the
seconds per stage and the test-split table of metrics/eval.json (popularity, SASRec, the SFT
model and the GRPO model trained from it, all from this one run and seed). Targets: the
whole run <= 20 minutes on 2 CPU cores (issue 4); the GRPO model's test HR@10 / NDCG@10
above its own SFT starting point, next to SASRec and popularity (issue 5).
"""

from __future__ import annotations

import importlib
import os
import tempfile
import time
from pathlib import Path

from bench.common import bench_args
from sidrec.config import load_settings
from sidrec.stage import STAGES

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    args = bench_args(
        __doc__,
        lambda p: p.add_argument(
            "--set", dest="overrides", action="append", default=[], help="section.key=value"
        ),
    )
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        os.chdir(work)
        settings = load_settings(
            REPO / "params.yaml",
            [
                f"project.data_dir={work / 'data'}",
                f"project.metrics_dir={work / 'metrics'}",
                f"project.artifacts_dir={work / 'artifacts'}",
                f"embed.cache_dir={work / 'cache'}",
                *args.overrides,
            ],
        )
        results = {}
        for stage in STAGES:
            stage_fn = getattr(importlib.import_module(f"tasks.{stage}"), stage)
            started = time.perf_counter()
            results[stage] = stage_fn(settings)
            seconds[stage] = time.perf_counter() - started
    report = results["evaluate"].metrics
    sft = results["sft"].metrics
    print(
        f"MovieLens-100k, {settings.split.method}, full-catalog ranking over {report['items']} items, "
        f"{report['test_rows']} test users; model preset {settings.model.preset} "
        f"({sft['parameters']:,} parameters, {sft['steps']} SFT steps); {args.threads} CPU threads\n"
    )
    print("| stage | " + " | ".join(STAGES) + " | total |")
    print("|---|" + "---|" * (len(STAGES) + 1))
    print(
        "| seconds | "
        + " | ".join(f"{seconds[s]:.0f}" for s in STAGES)
        + f" | {sum(seconds.values()):.0f} |\n"
    )
    ks = report["ks"]
    print(
        "| model (test) | "
        + " | ".join(f"HR@{k}" for k in ks)
        + " | "
        + " | ".join(f"NDCG@{k}" for k in ks)
        + " |"
    )
    print("|---|" + "---|" * (2 * len(ks)))
    for name, row in report["test"].items():
        cells = [f"{row[f'hr@{k}']:.4f}" for k in ks] + [f"{row[f'ndcg@{k}']:.4f}" for k in ks]
        print(f"| {name} | " + " | ".join(cells) + " |")
    grpo = results["grpo"].metrics
    print(
        f"\ninvalid generation rate: SFT {report['test']['sft']['invalid_rate']:.4f}, GRPO "
        f"{report['test']['grpo']['invalid_rate']:.4f}; SASRec best epoch {report['sasrec_best_epoch']}"
        f"\nGRPO: {grpo['steps']} steps of {grpo['prompts_per_step']} prompts x G={grpo['num_generations']} "
        f"{grpo['rollout']} rollouts, rewards {grpo['rewards']}; validation NDCG@10 (sample of "
        f"{grpo['valid_users']} users) {grpo['valid_start']['ndcg@10']:.4f} at the SFT start, best "
        f"{grpo['valid_best']['ndcg@10']:.4f} at step {grpo['best_step']}"
        f"\nregister: {results['register'].metrics.get('model_name')} "
        f"v{results['register'].metrics.get('version')}, promoted {results['register'].metrics.get('promoted')}"
    )


if __name__ == "__main__":
    main()
