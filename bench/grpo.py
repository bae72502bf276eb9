"""Benchmark: GRPO step time with beam-search rollouts against constrained sampling at the same G.

    python -m bench.grpo [--steps 10] [--set section.key=value ...]

Needs the outputs of `make run` (or `sidrec pipeline --until sft`) in the project folder:
the data, the SID map, the SFT model and SASRec (the teacher of GRPO's anchor, on by default;
`--set grpo.sft_anchor=0` times GRPO without it). Each rollout mode trains a copy of the SFT model
for ``--steps`` steps in a temporary folder (nothing in the project is touched) and reports
TRL's own ``step_time`` (rollout generation, rewards and the optimizer step; the validation
runs before and after are not counted). Target (issue 5): beam ≤ 1.5× sample.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from bench.common import bench_args
from sidrec.config import load_settings
from tasks.grpo import grpo

MODES = ("beam", "sample", "dynamic")


def main() -> None:
    args = bench_args(
        __doc__,
        lambda p: (
            p.add_argument("--steps", type=int, default=10),
            p.add_argument(
                "--set", dest="overrides", action="append", default=[], help="section.key=value"
            ),
        ),
    )
    project = load_settings("params.yaml", args.overrides)
    if not project.paths.sft_model.is_dir():
        raise SystemExit(f"{project.paths.sft_model} not found: run `make run` first")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        for mode in MODES:
            settings = load_settings(
                "params.yaml",
                [
                    *args.overrides,
                    f"project.artifacts_dir={work / mode}",
                    f"project.metrics_dir={work / mode / 'metrics'}",
                    f"grpo.rollout={mode}",
                    f"grpo.max_steps={args.steps}",
                    f"grpo.eval_every={args.steps}",
                    "grpo.eval_users=50",
                    # the rewards do not change what a rollout costs; no SASRec to train
                    "grpo.rewards.collaborative=0",
                    "grpo.ensure_target=false",  # refused with sample rollouts
                ],
            )
            shutil.copytree(project.paths.sft_model, settings.paths.sft_model)
            if project.paths.sasrec_model.is_dir():  # the anchor's teacher (grpo.sft_anchor)
                shutil.copytree(project.paths.sasrec_model, settings.paths.sasrec_model)
            m = grpo(settings).metrics
            rows.append((mode, m))
    g, p = project.grpo.num_generations, project.grpo.prompts_per_step
    print(
        f"GRPO on {project.project.dataset}, preset {project.model.preset}: {p} prompts x G={g} "
        f"completions per step, {args.steps} steps per mode, {args.threads} CPU threads\n"
    )
    print("| rollout | step s (mean) | step s (median) | distinct items / group | vs sample |")
    print("|---|---|---|---|---|")
    sample = np.median(dict(rows)["sample"]["step_times"])
    for mode, m in rows:
        times = m["step_times"]
        print(
            f"| {mode} | {np.mean(times):.3f} | {np.median(times):.3f} | "
            f"{m['distinct_items_per_group']:.3f} | {np.median(times) / sample:.2f}× |"
        )


if __name__ == "__main__":
    main()
