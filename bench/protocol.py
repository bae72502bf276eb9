"""Benchmark: the results table under both evaluation protocols, from the models on disk.

    make run && python -m bench.protocol

Reads ``metrics/eval.json`` of the last run (seen items excluded, the default protocol),
evaluates the same models, splits and SASRec a second time with
``evaluate.exclude_seen: false`` into a temporary metrics folder, and prints both tables:
test HR@10 / NDCG@10 with 95% bootstrap intervals over users, coverage and popularity per
model, and the paired intervals of the differences that matter ("beats" only where the
paired interval excludes 0). ``python -m bench.pipeline`` prints the same tables for a cold
run of every stage.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.common import bench_args
from bench.pipeline import results_table
from sidrec.config import load_settings
from tasks.evaluate import evaluate


def main() -> None:
    args = bench_args(
        __doc__,
        lambda p: p.add_argument("--config", default="params.yaml", help="params.yaml of the run"),
    )
    settings = load_settings(Path(args.config))
    masked = json.loads(settings.paths.metrics("eval").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        unmasked = settings.model_copy(
            update={
                "project": settings.project.model_copy(update={"metrics_dir": Path(tmp)}),
                "evaluate": settings.evaluate.model_copy(update={"exclude_seen": False}),
            }
        )
        plain = evaluate(unmasked).metrics
    print(f"{settings.project.dataset}, {settings.split.method}; {args.threads} CPU threads\n")
    print(results_table(masked, "seen items excluded (default)"))
    print(results_table(plain, "nothing excluded"))


if __name__ == "__main__":
    main()
