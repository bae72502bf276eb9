"""Benchmark: the whole default pipeline on MovieLens-100k, stage by stage, and its eval table.

    python -m bench.pipeline        # or: make bench

Runs every stage function in order (as `make run` does, without the Prefect server) in a
temporary folder with the repo's params.yaml and a cold embedding cache, evaluates the same
models a second time with ``evaluate.exclude_seen: false``, then prints the seconds per stage
and the results table under both protocols — popularity, SASRec, the SFT model and the GRPO
model trained from it, all from this one run and seed — with 95% bootstrap intervals over
users and the paired intervals of the differences that matter ("beats" only where the paired
interval excludes 0). Target: the whole run <= 15 minutes on 2 CPU cores.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench.common import bench_args, run_stages
from sidrec.stage import STAGES
from tasks.evaluate import evaluate


def main() -> None:
    args = bench_args(
        __doc__,
        lambda p: p.add_argument(
            "--set", dest="overrides", action="append", default=[], help="section.key=value"
        ),
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings, results, seconds = run_stages(work, args.overrides)
        unmasked = settings.model_copy(
            update={
                "project": settings.project.model_copy(
                    update={"metrics_dir": work / "metrics-unmasked"}
                ),
                "evaluate": settings.evaluate.model_copy(update={"exclude_seen": False}),
            }
        )
        unmasked_report = evaluate(unmasked).metrics
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
    for name, r in (
        ("seen items excluded (default)", report),
        ("nothing excluded", unmasked_report),
    ):
        print(results_table(r, name))
    grpo = results["grpo"].metrics
    print(
        f"invalid generation rate: SFT {report['test']['sft']['invalid_rate']:.4f}, GRPO "
        f"{report['test']['grpo']['invalid_rate']:.4f}; SASRec best epoch {report['sasrec_best_epoch']}"
        f"\nGRPO: {grpo['steps']} steps of {grpo['prompts_per_step']} prompts x G={grpo['num_generations']} "
        f"{grpo['rollout']} rollouts, rewards {grpo['rewards']}; validation NDCG@10 (sample of "
        f"{grpo['valid_users']} users) {grpo['valid_start']['ndcg@10']:.4f} at the SFT start, best "
        f"{grpo['valid_best']['ndcg@10']:.4f} at step {grpo['best_step']}"
        f"\nregister: {results['register'].metrics.get('model_name')} "
        f"v{results['register'].metrics.get('version')}, promoted {results['register'].metrics.get('promoted')}"
    )


def results_table(report: dict[str, Any], protocol: str) -> str:
    """Test HR@10 / NDCG@10 with 95% intervals, coverage and popularity per model, then the
    paired differences, as a markdown table."""
    test, ci = report["test"], report["intervals"]["test"]
    lines = [
        f"**{protocol}** — {report['test_rows']} test users, {report['protocol']['num_beams']} beams",
        "",
        "| model (test) | HR@10 [95% CI] | NDCG@10 [95% CI] | coverage@10 | popularity pct@10 |",
        "|---|---|---|---|---|",
    ]
    for name, row in test.items():
        cells = [
            f"{row[m]:.4f} [{ci[name][m]['low']:.4f}, {ci[name][m]['high']:.4f}]"
            for m in ("hr@10", "ndcg@10")
        ]
        lines.append(
            f"| {name} | {' | '.join(cells)} | {row['coverage@10']:.3f} | "
            f"{row['popularity_percentile@10']:.1f} |"
        )
    for pair, diff in report["paired"]["test"].items():
        d = diff["ndcg@10"]
        word = "beats" if d["low"] > 0 else "trails" if d["high"] < 0 else "within noise"
        pair = pair.replace("best generative", f"best generative ({report['best_generative']})")
        lines.append(
            f"| {pair} (paired) | | {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}] {word} | | |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
