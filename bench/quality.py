"""Benchmark: test quality over seeds per preset (popularity, SASRec, SFT, GRPO), and SFT's
validation curve per objective.

    python -m bench.quality                                # presets default and quality, seeds 0 1 2
    python -m bench.quality --presets default --seeds 0    # one preset, one seed
    python -m bench.quality --set sft.epochs=1             # any params.yaml key, for every run
    python -m bench.quality --skip-run                     # tables, JSON and plot from the runs
    python -m bench.quality --presets quality --until baselines   # prepare the folders (a CPU),
    python -m bench.quality --presets quality --start sft         # then train there (a GPU)

Each preset and seed runs ingest → evaluate in its own folder, ``<workdir>/<preset>/seed-<s>``
(``--set project.preset=<preset> --set project.seed=<s>``); a folder whose finished run had the
same resolved settings is reused, not rerun. ``--until`` stops the runs after a stage (no
report); ``--start`` runs from a stage in folders prepared that way with the same options, which
may have travelled inside the repo to another machine (paths inside the repo are recorded
relative to it). Every run scores the same test users (the split
does not depend on the seed). Per preset it prints:

- test HR@10 and NDCG@10 per model, mean ± sd over the seeds (sample sd). "best generative" is,
  per seed, the SID model evaluate picked on the validation selection half (never on the gate
  half or test);
- best generative / SASRec test NDCG@10: the ratio of the seed-averaged means,
  ``mean_s mean_u best[s, u] / mean_s mean_u sasrec[s, u]`` (the "mean of the seeds" the
  targets name), with a 95% paired bootstrap interval over users: each replicate draws one
  resample of the test users and applies it to every seed and both models. It covers which
  users were tested, not the seeds (their spread is the sd). Targets, printed and never
  asserted: >= 1.0x (preset default), >= 1.15x (preset quality);
- GRPO − SFT test NDCG@10 (where GRPO ran): the mean over users of the seed-averaged per-user
  difference, with its paired bootstrap interval over users, and GRPO / SFT;
- with two or more seeds, for both comparisons: the half-width their interval would keep with
  endless seeds (``models.stats.seed_noise``), the test users' own spread: a smaller difference
  cannot be told from noise on these users however many seeds run;
- minutes per stage, mean over the seeds (the runs share one embedding cache: embed is cold in
  the first run only).

Then, per preset and ``--objectives`` entry, SFT's valid NDCG@10 (validation selection users)
against training minutes, on the first seed: the preset's own run where its ``metrics/sft.json``
has that objective, else a run until sft with ``--set sft.objective=<objective>``. Minutes are
approximate: the stage's ``train_seconds`` (training and its validations) spread evenly over the
optimizer steps, so the validation after step t sits at t / steps × train_seconds.

Writes ``metrics/quality.json`` (the tables' numbers and the machine of the runs) and the plot
``docs/img/quality-valid-ndcg.png``, and logs both to an MLflow run ``bench-quality``. With
``--output FILE`` the plot is ``FILE``'s name with ``-valid-ndcg.png`` beside it instead, so a
side run leaves the README's files as they are.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from bench.common import (
    REPO,
    RUN_RECORD,
    bench_args,
    ensure_run,
    folder_paths,
    folder_settings,
    run_record,
)
from models.stats import paired_bootstrap_interval, paired_ratio_interval, seed_noise
from sidrec.config import load_settings
from sidrec.errors import InputError, SidrecError
from sidrec.io import atomic_path, atomic_write_json, read_json
from sidrec.stage import STAGES, Stage
from sidrec.tracking import log_stage, metric_key
from tasks.evaluate import BEST

PRESET_KEY = "project.preset"
TARGETS = {"default": 1.0, "quality": 1.15}
"""Best generative / SASRec test NDCG@10 each preset aims at (no entry: no target)."""
METRICS = ("hr@10", "ndcg@10")
RATIO_METRIC = "ndcg@10"
CONFIDENCE = 0.95
PLOT = REPO / "docs" / "img" / "quality-valid-ndcg.png"
RERUN_HINT = "run `python -m bench.quality` without --skip-run (same options) to make it"
LAST: Stage = "evaluate"
"""The runs end here (what the report reads); registering is not part of a benchmark."""
RUN_STAGES = STAGES[: STAGES.index(LAST) + 1]


def run_folder(workdir: Path, preset: str, seed: int, objective: str | None = None) -> Path:
    name = f"seed-{seed}" if objective is None else f"objective-{objective}-seed-{seed}"
    return workdir / preset / name


def run_overrides(preset: str, seed: int, overrides: list[str]) -> list[str]:
    """A run's ``section.key=value`` list: the preset, the user's overrides, then the seed."""
    return [f"{PRESET_KEY}={preset}", *overrides, f"project.seed={seed}"]


def shown(path: Path) -> str:
    """``path`` relative to the repo where it lies inside it (what quality.json records)."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


class SeedRun(NamedTuple):
    """One finished run: its record, ``metrics/eval.json`` and its per-user test scores."""

    folder: Path
    record: dict[str, Any]
    report: dict[str, Any]
    users: pd.DataFrame


def load_seed_run(folder: Path) -> SeedRun:
    record = run_record(folder, RERUN_HINT)
    paths = folder_paths(folder, record["dataset"])
    report = read_json(
        paths.metrics("eval"), "eval metrics", f"the run has no evaluate; {RERUN_HINT}"
    )
    if not paths.eval_users.exists():
        raise InputError(f"per-user scores not found; {RERUN_HINT}", path=paths.eval_users)
    users = pd.read_parquet(paths.eval_users, columns=["split", "model", "user_id", *METRICS])
    return SeedRun(folder, record, report, users[users["split"] == "test"])


def spread(values: list[float]) -> dict[str, Any]:
    """Mean and sample sd over seeds (sd null for one seed), and the values per seed."""
    sd = statistics.stdev(values) if len(values) > 1 else None
    return {
        "mean": round(statistics.fmean(values), 6),
        "sd": None if sd is None else round(sd, 6),
        "per_seed": values,
    }


def summarize_preset(preset: str, runs: list[SeedRun], *, resamples: int) -> dict[str, Any]:
    """Per model mean ± sd over the seeds, best generative / SASRec with its paired interval,
    minutes per stage and the machine (from the first run's record)."""
    models = list(runs[0].report["test"])
    for run in runs[1:]:
        if list(run.report["test"]) != models:
            raise InputError(
                f"evaluated models {list(run.report['test'])}, but {runs[0].folder} has {models}: "
                "every seed must evaluate the same models (same grpo.enabled)",
                path=run.folder,
            )
    best = [run.report["best_generative"] for run in runs]
    table = {
        model: {m: spread([r.report["test"][model][m] for r in runs]) for m in METRICS}
        for model in models
    }
    table[BEST] = {
        m: spread([r.report["test"][b][m] for r, b in zip(runs, best, strict=True)])
        for m in METRICS
    }
    stages = list(runs[0].record["seconds"])
    minutes = {
        s: round(statistics.fmean(r.record["seconds"][s] for r in runs) / 60, 2) for s in stages
    }
    minutes["total"] = round(sum(minutes.values()), 2)
    return {
        "seeds": [r.record["seed"] for r in runs],
        "runs": [shown(r.folder) for r in runs],
        "test_users": int(runs[0].report["test_rows"]),
        "best_generative": best,
        "models": table,
        "best_generative_vs_sasrec": best_vs_sasrec(runs, best, preset, resamples),
        "grpo_minus_sft": grpo_minus_sft(runs, resamples),
        "minutes": minutes,
        "machine": runs[0].record["machine"],
        "prepared_on": runs[0].record.get("prepared_on"),
    }


def per_seed(runs: list[SeedRun], models: list[list[str]]) -> list[np.ndarray]:
    """Per test user and seed, each model's ``RATIO_METRIC``: one users x seeds array per model
    column of ``models`` (``models[seed][column]``; the best generative model differs by seed),
    every array in the same user order."""

    def scores(run: SeedRun, model: str) -> pd.Series:
        rows = run.users[run.users["model"] == model]
        return pd.Series(rows[RATIO_METRIC].to_numpy(), index=rows["user_id"].to_numpy())

    by_seed = [[scores(r, m) for m in ms] for r, ms in zip(runs, models, strict=True)]
    users = by_seed[0][0].index
    for run, series_of_run in zip(runs, by_seed, strict=True):
        for series in series_of_run:
            if not series.index.is_unique or set(series.index) != set(users):
                raise InputError(
                    f"test users differ from those of {runs[0].folder}: the paired interval needs "
                    "every seed and model scored on the same users (same split and evaluate.max_users)",
                    path=run.folder,
                )
    columns = zip(*by_seed, strict=True)
    return [np.stack([s.reindex(users).to_numpy() for s in col], axis=1) for col in columns]


def best_vs_sasrec(
    runs: list[SeedRun], best: list[str], preset: str, resamples: int
) -> dict[str, Any]:
    """Ratio of the seed-averaged test means, best generative over SASRec, with the paired
    bootstrap over users (one resample of users for every seed and both models)."""
    best_seeds, sasrec_seeds = per_seed(runs, [[b, "sasrec"] for b in best])
    best_mean, sasrec_mean = best_seeds.mean(axis=1), sasrec_seeds.mean(axis=1)
    interval = paired_ratio_interval(
        best_mean, sasrec_mean, confidence=CONFIDENCE, n_resamples=resamples
    )
    target = TARGETS.get(preset)
    return {
        "metric": RATIO_METRIC,
        "ratio": round(interval.mean, 4),
        "low": round(interval.low, 4),
        "high": round(interval.high, 4),
        "confidence": CONFIDENCE,
        "resamples": resamples,
        "target": target,
        "met": None if target is None else interval.mean >= target,
        **endless_seeds(best_seeds - sasrec_seeds, float(sasrec_mean.mean())),
    }


def endless_seeds(diffs: np.ndarray, reference: float) -> dict[str, Any]:
    """With two or more seeds: the half-width the interval of the mean difference keeps with
    endless seeds (``models.stats.seed_noise``; the users' own spread), in the metric and as a
    share of ``reference``'s mean; nothing with one seed."""
    if diffs.shape[1] < 2:
        return {}
    half = seed_noise(diffs, confidence=CONFIDENCE).half_width_endless
    return {"half_width_endless_seeds": round(half, 5), "relative": round(half / reference, 4)}


def grpo_minus_sft(runs: list[SeedRun], resamples: int) -> dict[str, Any] | None:
    """GRPO − SFT test NDCG@10 of the seed-averaged per-user scores, with the paired bootstrap
    interval over users (None when GRPO was not evaluated)."""
    if "grpo" not in runs[0].report["test"]:
        return None
    grpo_seeds, sft_seeds = per_seed(runs, [["grpo", "sft"]] * len(runs))
    grpo, sft = grpo_seeds.mean(axis=1), sft_seeds.mean(axis=1)
    interval = paired_bootstrap_interval(grpo, sft, confidence=CONFIDENCE, n_resamples=resamples)
    return {
        "metric": RATIO_METRIC,
        "diff": round(interval.mean, 5),
        "low": round(interval.low, 5),
        "high": round(interval.high, 5),
        "ratio": round(float(grpo.mean() / sft.mean()), 4),
        "confidence": CONFIDENCE,
        "resamples": resamples,
        **endless_seeds(grpo_seeds - sft_seeds, float(sft.mean())),
    }


def sft_objective(folder: Path) -> str | None:
    """The objective a finished run's SFT stage trained (None: no such run)."""
    path = folder / RUN_RECORD
    if not path.exists():
        return None
    dataset = json.loads(path.read_text())["dataset"]
    sft = folder_paths(folder, dataset).metrics("sft")
    return json.loads(sft.read_text()).get("objective") if sft.exists() else None


def objective_folder(workdir: Path, preset: str, seed: int, objective: str) -> Path:
    """The preset's own run when its SFT trained ``objective``, else the objective's run."""
    own = run_folder(workdir, preset, seed)
    return own if sft_objective(own) == objective else run_folder(workdir, preset, seed, objective)


def sft_curve(folder: Path) -> dict[str, Any]:
    """SFT's valid NDCG@10 per validation against approximate training minutes."""
    record = run_record(folder, RERUN_HINT)
    sft = read_json(
        folder_paths(folder, record["dataset"]).metrics("sft"), "SFT metrics", RERUN_HINT
    )
    minutes_per_step = sft["train_seconds"] / 60 / max(1, sft["steps"])
    return {
        "run": shown(folder),
        "objective": sft["objective"],
        "train_minutes": round(sft["train_seconds"] / 60, 2),
        "best_epoch": sft["best_epoch"],
        "valid_best": sft["valid_best"]["ndcg@10"],
        "curve": [
            [round(r["step"] * minutes_per_step, 3), r["ndcg@10"]] for r in sft["valid_history"]
        ],
    }


def build_report(
    workdir: Path, presets: list[str], seeds: list[int], objectives: list[str], *, resamples: int
) -> dict[str, Any]:
    """metrics/quality.json's content, read from the finished run folders under ``workdir``."""
    report: dict[str, Any] = {"presets": {}, "objectives": {}}
    for preset in presets:
        runs = [load_seed_run(run_folder(workdir, preset, s)) for s in seeds]
        report["dataset"] = runs[0].record["dataset"]
        report["presets"][preset] = summarize_preset(preset, runs, resamples=resamples)
        curves = {o: sft_curve(objective_folder(workdir, preset, seeds[0], o)) for o in objectives}
        if curves:
            report["objectives"][preset] = curves
    return report


def plot_curves(objectives: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """One panel per preset, one line per objective: valid NDCG@10 against training minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(objectives), figsize=(5 * len(objectives), 3.6), squeeze=False)
    for ax, (preset, curves) in zip(axes[0], objectives.items(), strict=True):
        for objective, curve in curves.items():
            x, y = zip(*curve["curve"], strict=True) if curve["curve"] else ((), ())
            ax.plot(x, y, marker="o", label=objective)
        ax.set(title=f"preset {preset}", xlabel="SFT training minutes (approx.)")
        ax.set_ylabel("valid NDCG@10")
        ax.grid(alpha=0.3)
        ax.legend(title="sft.objective")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def tables(report: dict[str, Any]) -> str:
    """The printed output: per preset the models table, the ratio line and minutes per stage;
    then SFT per objective."""
    lines = []
    for preset, p in report["presets"].items():
        m = p["machine"]
        prepared = p.get("prepared_on")
        before = (
            ""
            if prepared is None
            else f" (the stages until {prepared['until']} on {prepared['machine']['cpus']} CPUs, "
            f"GPU {prepared['machine']['gpu'] or 'none'})"
        )
        lines += [
            f"**preset {preset}** — {report['dataset']}, {p['test_users']} test users, mean ± sd "
            f"over seeds {', '.join(map(str, p['seeds']))}; {m['cpus']} CPUs, "
            f"{m['torch_threads']} torch threads, GPU {m['gpu'] or 'none'}{before}",
            "",
            "| model (test) | HR@10 | NDCG@10 |",
            "|---|---|---|",
        ]
        for model, row in p["models"].items():
            name = f"{model} ({', '.join(p['best_generative'])})" if model == BEST else model
            lines.append(f"| {name} | " + " | ".join(_mean_sd(row[k]) for k in METRICS) + " |")
        r = p["best_generative_vs_sasrec"]
        verdict = (
            ""
            if r["target"] is None
            else f"; target >= {r['target']:.2f}x: " + ("met" if r["met"] else "NOT met")
        )
        lines += [
            "",
            f"best generative / SASRec test NDCG@10: {r['ratio']:.2f}x [{r['low']:.2f}, "
            f"{r['high']:.2f}] (paired bootstrap over users, {r['confidence']:.0%}){verdict}"
            + _endless(r, "SASRec"),
            "",
        ]
        g = p["grpo_minus_sft"]
        if g is not None:
            lines += [
                f"GRPO - SFT test NDCG@10: {g['diff']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}] "
                f"({g['ratio']:.3f}x; paired bootstrap over users, {g['confidence']:.0%})"
                + _endless(g, "SFT"),
                "",
            ]
        lines += [
            "| minutes | " + " | ".join(p["minutes"]) + " |",
            "|---|" + "---|" * len(p["minutes"]),
            "| mean over seeds | " + " | ".join(f"{v:.1f}" for v in p["minutes"].values()) + " |",
            "",
        ]
    for preset, curves in report["objectives"].items():
        lines += [
            f"**SFT objectives, preset {preset}** (first seed)",
            "",
            "| sft.objective | train minutes | best epoch | best valid NDCG@10 | validations |",
            "|---|---|---|---|---|",
        ]
        for objective, c in curves.items():
            lines.append(
                f"| {objective} | {c['train_minutes']:.1f} | {c['best_epoch']:g} | "
                f"{c['valid_best']:.4f} | {len(c['curve'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def tracked_metrics(report: dict[str, Any]) -> dict[str, float]:
    """What the MLflow run records: per preset, model and metric the mean over seeds, and the
    best generative / SASRec ratio."""
    metrics = {}
    for preset, p in report["presets"].items():
        metrics[f"{preset}.best_generative_over_sasrec"] = p["best_generative_vs_sasrec"]["ratio"]
        if p["grpo_minus_sft"] is not None:
            metrics[f"{preset}.grpo_minus_sft"] = p["grpo_minus_sft"]["diff"]
        for model, row in p["models"].items():
            for k in METRICS:
                metrics[metric_key(f"{preset}.{model}.{k}")] = row[k]["mean"]
    return metrics


def _endless(comparison: dict[str, Any], reference: str) -> str:
    """The sentence on the interval's half-width with endless seeds (two or more seeds)."""
    if "half_width_endless_seeds" not in comparison:
        return ""
    return (
        f"; with endless seeds the interval would keep ± "
        f"{comparison['half_width_endless_seeds']:.4f} (± {comparison['relative']:.3f}x of "
        f"{reference}): the test users' own spread, which no seed removes"
    )


def _mean_sd(spread: dict[str, Any]) -> str:
    sd = "n/a" if spread["sd"] is None else f"{spread['sd']:.4f}"
    return f"{spread['mean']:.4f} ± {sd}"


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--presets", "--preset", nargs="+", default=["default", "quality"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--objectives", nargs="*", default=["sequence", "rows"])
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "bench" / "runs" / "quality")
    parser.add_argument(
        "--skip-run", action="store_true", help="only read the finished run folders"
    )
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap replicates")
    parser.add_argument("--output", type=Path, help="default: metrics/quality.json")
    parser.add_argument(
        "--start",
        choices=RUN_STAGES,
        default=STAGES[0],
        help="first stage to run (default: ingest)",
    )
    parser.add_argument(
        "--until",
        choices=RUN_STAGES,
        default=LAST,
        help="last stage to run; before evaluate the folders are only prepared (no report)",
    )


def plot_path(output: Path | None) -> Path:
    """Where the SFT curves go: the README's image, or beside an ``--output`` file of one's own."""
    return PLOT if output is None else output.with_name(f"{output.stem}-valid-ndcg.png")


def main() -> None:
    args = bench_args(__doc__, _options)
    workdir = args.workdir.resolve()
    overrides = [f"embed.cache_dir={workdir / 'cache'}", *args.overrides]
    output = args.output or REPO / load_settings(REPO / "params.yaml").paths.metrics("quality")
    plot = plot_path(args.output)
    if not args.skip_run:
        for preset in args.presets:  # a bad preset, objective or --set fails before training
            run = run_overrides(preset, args.seeds[0], overrides)
            for extra in [[], *([f"sft.objective={o}"] for o in args.objectives)]:
                folder_settings(workdir, [*run, *extra])
        for preset in args.presets:
            for seed in args.seeds:
                run = run_overrides(preset, seed, overrides)
                folder = run_folder(workdir, preset, seed)
                ensure_run(folder, run, args.until, start=args.start)
            if args.until != LAST:
                continue
            for objective in args.objectives:  # the preset's own run where it trained this one
                folder = objective_folder(workdir, preset, args.seeds[0], objective)
                if folder != run_folder(workdir, preset, args.seeds[0]):
                    run = run_overrides(preset, args.seeds[0], overrides)
                    ensure_run(folder, [*run, f"sft.objective={objective}"], "sft")
        if args.until != LAST:
            print(f"prepared until {args.until} under {workdir}; no report before evaluate")
            return
    report = build_report(
        workdir, args.presets, args.seeds, args.objectives, resamples=args.resamples
    )
    report["overrides"] = args.overrides
    artifacts = [output]
    if report["objectives"]:
        plot_curves(report["objectives"], plot)
        report["plot"] = shown(plot)
        artifacts.append(plot)
    atomic_write_json(output, report)
    print(tables(report))
    log_stage(
        dataset=report["dataset"],
        stage="bench-quality",
        params={"presets": args.presets, "seeds": args.seeds, "overrides": args.overrides},
        metrics=tracked_metrics(report),
        artifacts=artifacts,
    )


if __name__ == "__main__":
    try:
        main()
    except SidrecError as exc:  # a missing run folder, a bad --set: the message, no traceback
        raise SystemExit(f"error: {exc}") from None
