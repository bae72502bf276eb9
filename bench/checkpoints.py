"""Benchmark: what checkpoint selection on the validation rows costs on test.

    python -m bench.checkpoints --run bench/runs/quality/default/seed-0 --out /tmp/ckpt-0
    python -m bench.checkpoints --run RUN --out OUT --set sft.distill=2 --set sft.epochs=10

Copies a finished run folder's split, SIDs and SASRec (``bench.quality`` or `make run`; the
trained SID models are left behind) to ``--out``, trains SFT there with the run's seed and
``--set`` overrides, and at every validation also ranks the test users exactly as
``evaluate`` ranks them (the shared recommender, the user's train and valid items excluded).
The gate half of the validation users (the ones evaluate reports as ``valid`` and the
promotion gate reads, never used to select) is ranked the same way, so a selection rule can be
judged on validation users before test is read; both are written per user to
``OUT/checkpoint-scores.json``. Test scores are recorded only, never used to choose: the kept
model is the one training keeps (``sft.patience: null`` sees the whole schedule; the table then
marks the validation that ``--patience`` would have stopped at). ``--evaluate`` then runs the evaluate stage there
(``grpo.enabled=false``), so ``bench.compare RUN OUT`` pairs the kept model with the run's,
and writes the run record that ``bench.quality --skip-run`` reads (``--out`` laid out as
``WORKDIR/PRESET/seed-N``: a variant trained from prepared folders, e.g. on a lent GPU; the SFT
seconds there include ranking the test users at every validation).
Prints a markdown table: epoch, selection NDCG@10, gate NDCG@10, test NDCG@10 and HR@10.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

from bench.common import (
    RUN_RECORD,
    bench_args,
    folder_settings,
    prepared_by,
    run_stages,
    write_run_record,
)
from sidrec.stage import Stage


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=Path, required=True, help="a finished run folder")
    parser.add_argument("--out", type=Path, required=True, help="where the SFT run goes")
    parser.add_argument("--seed", type=int, default=None, help="default: the run's seed")
    parser.add_argument(
        "--patience", type=int, default=None, help="also mark where this patience stops"
    )
    parser.add_argument("--evaluate", action="store_true", help="then run evaluate there")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )


def kept_by_patience(selection: list[float], patience: int | None) -> int:
    """Index of the validation early stopping would keep: the best so far when ``patience``
    validations in a row did not beat it (or the best overall)."""
    best, stale = 0, 0
    for i, value in enumerate(selection):
        if i == 0 or value > selection[best]:
            best, stale = i, 0
            continue
        stale += 1
        if patience is not None and stale >= patience:
            break
    return best


def _copy_inputs(run: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(run / "data", out / "data")
    shutil.copytree(run / "artifacts" / "baselines", out / "artifacts" / "baselines")
    shutil.copytree(run / "metrics", out / "metrics")


def evaluate_and_record(
    out: Path,
    overrides: list[str],
    sft_seconds: dict[Stage, float],
    source: dict[str, Any] | None,
) -> dict[str, Any]:
    """Run evaluate in ``out`` (``grpo.enabled=false``: SFT is the generative model there) and
    write the run record that ``bench.quality --skip-run`` reads: the SFT and evaluate seconds,
    and, where ``source`` (the copied folder's own record) is known, the stages before SFT as
    prepared there."""
    evaluated = [*overrides, "grpo.enabled=false"]
    (out / RUN_RECORD).unlink(missing_ok=True)  # unfinished until evaluate has run
    scored = run_stages(out, evaluated, start="evaluate", until="evaluate")
    prepared = None if source is None else prepared_by(source, "sft")
    return write_run_record(out, evaluated, "evaluate", {**sft_seconds, **scored.seconds}, prepared)


def main() -> None:
    args = bench_args(__doc__, _options)
    import json

    import tasks.sft
    from models.baselines import encode_targets
    from models.metrics import per_row_metrics
    from sidrec.errors import InputError
    from tasks.evaluate import eval_rows, exclusions
    from tasks.shared.inputs import read_split
    from tasks.shared.validation import ValidationSample

    source = args.run / RUN_RECORD  # a bench.quality run folder has one
    record = json.loads(source.read_text()) if source.exists() else None
    seed = args.seed
    if seed is None:
        if record is None:
            raise InputError(f"no {RUN_RECORD} to read the seed from: pass --seed", path=source)
        seed = int(record["seed"])
    for needed in ("data", "artifacts/baselines", "metrics"):
        if not (args.run / needed).is_dir():
            raise InputError(
                "not a finished run folder: run the pipeline there first", path=args.run / needed
            )
    _copy_inputs(args.run, args.out)
    overrides = [f"project.seed={seed}", *args.overrides]
    settings = folder_settings(args.out.resolve(), overrides)
    scores: dict[str, list[dict[str, Any]]] = {"gate": [], "test": []}

    class WithTest(ValidationSample):
        """The selection sample as training reads it, plus the gate half and the test users,
        each ranked as evaluate ranks them, recorded only."""

        def __init__(self, settings: Any, recommender: Any, train: Any, valid: Any, **kw: Any):
            super().__init__(settings, recommender, train, valid, **kw)
            test = read_split(settings, "test")
            splits = {"train": train, "valid": valid, "test": test}
            self.extra = {}
            for split, rows in eval_rows(settings, splits).items():  # the rows evaluate scores
                name = "gate" if split == "valid" else split
                self.extra[name] = (
                    [list(h) for h in rows["history"]],
                    exclusions(settings, splits, split, rows),
                    encode_targets(list(rows["target"]), recommender.index, name),
                )

        def __call__(self, model: Any) -> dict[str, float]:
            metrics = super().__call__(model)
            ranker = self.recommender.with_model(model)
            for name, (histories, exclude, targets) in self.extra.items():
                ranking = ranker.rank(histories, 10, exclude=exclude)
                per_user = per_row_metrics(ranking.items, targets, (10,))
                scores[name].append(
                    {
                        **{m: float(v.mean()) for m, v in per_user.items()},
                        "per_user_ndcg@10": per_user["ndcg@10"].round(6).tolist(),
                    }
                )
            return metrics

    with mock.patch.object(tasks.sft, "ValidationSample", WithTest):
        trained = run_stages(args.out, overrides, start="sft", until="sft")
    if args.evaluate:
        evaluate_and_record(args.out, overrides, trained.seconds, record)
    report = json.loads(settings.paths.metrics("sft").read_text())
    history = report["valid_history"]
    selection = [h["ndcg@10"] for h in history]
    kept = next(i for i, h in enumerate(history) if h.get("epoch") == report["best_epoch"])
    marks: dict[int, list[str]] = {kept: ["kept"]}
    if args.patience is not None:
        stop = kept_by_patience(selection, args.patience)
        marks.setdefault(stop, []).append(f"kept at patience {args.patience}")
    epochs = [h.get("epoch") for h in history]
    (args.out / "checkpoint-scores.json").write_text(
        json.dumps({"epochs": epochs, "selection": selection, "kept": kept, **scores}) + "\n"
    )
    print(f"{args.out}: seed {seed}, {' '.join(args.overrides) or 'defaults'}")
    print("| epoch | selection NDCG@10 | gate NDCG@10 | test NDCG@10 | test HR@10 | |")
    print("|---|---|---|---|---|---|")
    rows = zip(history, scores["gate"], scores["test"], strict=True)
    for i, (h, g, t) in enumerate(rows):
        print(
            f"| {h.get('epoch', '?')} | {h['ndcg@10']:.4f} | {g['ndcg@10']:.4f} "
            f"| {t['ndcg@10']:.4f} | {t['hr@10']:.4f} | {', '.join(marks.get(i, []))} |"
        )


if __name__ == "__main__":
    main()
