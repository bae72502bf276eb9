"""Benchmark: test quality over seeds per preset (popularity, SASRec, EASE, the SASRec + EASE
blend, SFT, GRPO) on one source, beside the published figures of that dataset's protocol.

    python -m bench.quality                                # ml-100k, presets default and quality, seeds 0 1 2
    python -m bench.quality --source movielens-1m --presets default --seeds 0 1 2 --generative-seeds 0
    python -m bench.quality --presets default --seeds 0    # one preset, one seed
    python -m bench.quality --set sft.epochs=1             # any params.yaml key, for every run
    python -m bench.quality --skip-run                     # tables, JSON and plot from the seed files
    python -m bench.quality --source movielens-1m --seeds 0 --carry-out   # an unfinished SASRec, to commit
    python -m bench.quality --presets quality --until baselines   # prepare the folders (a CPU),
    python -m bench.quality --presets quality --start sft         # then train there (a GPU)
    python -m bench.quality --objectives sequence rows     # and SFT's validation curve per objective

``--source`` picks a built-in source (its dataset profile applies, ``project.profile: auto``)
and names the outputs: ``metrics/quality.json`` for params.yaml's own dataset (ml-100k), else
``metrics/quality-<source>.json``, with run folders under ``bench/runs/quality[-<source>]``.

Each preset and seed runs in its own folder, ``<workdir>/<preset>/seed-<s>``
(``--set project.preset=<preset> --set project.seed=<s>``): ingest → evaluate for the
``--generative-seeds`` (default: every seed), ingest → baselines and the baselines' scoring
alone (``tasks.evaluate.score_models(generative=False)``) for the others — the baseline rows
need more seeds than the hours of SFT allow. A folder whose finished run had the same resolved
settings is reused (a baselines-only folder continues from sft when it becomes generative).
Each seed's result is then kept in a small JSON file, ``metrics/quality-seeds/<dataset>/
<preset>/seed-<s>.json`` (its record, test means and, per model, the test users whose target
is in the top 10 with its rank): committed, so seeds run in different sessions or on other
machines merge; a seed file with the same settings is never rerun, and the report reads every
seed file of the preset (``--skip-run``: without running anything). A seed whose SASRec
outlasts a working session travels the same way: ``--carry-out`` (beside the running bench)
copies each run folder's SASRec training state to ``seed-<s>.sasrec-resume.pt`` beside its
seed file; a later run of that seed puts it back into its folder and SASRec goes on after the
carried epoch (``train_sasrec(resume=...)``); the file goes once the seed file is written.
``--until`` stops the runs
after a stage (no report); ``--start`` runs from a stage in folders prepared that way with the
same options, which may have travelled inside the repo to another machine. Every run scores the
same test users (the split does not depend on the seed). Per preset it prints:

- test HR@10 and NDCG@10 per model, mean ± sd over the seeds that ran it (sample sd). "best
  generative" is, per seed, the SID model evaluate picked on the validation selection half;
  "best baseline" the baseline with the highest NDCG@10 on the validation gate half (never
  test);
- best generative / best baseline and best generative / SASRec test NDCG@10 over the
  generative seeds: the ratio of the seed-averaged means, ``mean_s mean_u best[s, u] / mean_s
  mean_u base[s, u]``, with a 95% paired bootstrap interval over users (each replicate draws
  one resample of the test users and applies it to every seed and both models: it covers which
  users were tested, not the seeds, whose spread is the sd); for the best baseline also the
  difference's interval and its half-width relative to the best baseline's mean, beside the
  same figure of the ml-100k ``make run`` (``metrics/eval.json``);
- GRPO − SFT test NDCG@10 (where GRPO ran): the mean over users of the seed-averaged per-user
  difference, with its paired bootstrap interval over users, and GRPO / SFT;
- with two or more generative seeds: the half-width each interval would keep with endless
  seeds (``models.stats.seed_noise``), the test users' own spread;
- minutes per stage, mean over the seeds that ran it (the runs share one embedding cache:
  embed is cold in the first run only), and the machine;
- the dataset's published figures, labelled "published, their protocol" and never mixed into
  our rows (they rank items the user has already seen too; ours exclude them).

With ``--objectives``, per preset and objective SFT's valid NDCG@10 (validation selection
users) against training minutes, on the first generative seed: the preset's own run where its
``metrics/sft.json`` has that objective, else a run until sft with ``--set
sft.objective=<objective>`` (minutes approximate: the stage's ``train_seconds`` spread evenly
over the optimizer steps), drawn to ``docs/img/quality-valid-ndcg.png`` (with ``--output
FILE``: beside ``FILE``).

Writes the report JSON (the tables' numbers and the machine of the runs) and logs it to an
MLflow run ``bench-quality``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
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
    settings_digest,
)
from models.stats import paired_bootstrap_interval, paired_ratio_interval, seed_noise
from sidrec.config import load_settings
from sidrec.errors import InputError, SidrecError
from sidrec.io import atomic_path, atomic_write_json, read_json
from sidrec.stage import STAGES, Stage
from sidrec.tracking import log_stage, metric_key
from tasks.evaluate import BEST, BEST_BASELINE

PRESET_KEY = "project.preset"
TARGETS = {"default": 1.0, "quality": 1.15}
"""Best generative / SASRec test NDCG@10 each preset aims at on :data:`TARGETS_DATASET` (no
entry: no target); other datasets have none here."""
TARGETS_DATASET = "ml-100k"
METRICS = ("hr@10", "ndcg@10")
RATIO_METRIC = "ndcg@10"
TOP = 10
"""The seed files keep the ranks of the test targets within this top (what METRICS read)."""
CONFIDENCE = 0.95
PLOT = REPO / "docs" / "img" / "quality-valid-ndcg.png"
SEEDS_DIR = REPO / "metrics" / "quality-seeds"
RERUN_HINT = "run `python -m bench.quality` without --skip-run (same options) to make it"
LAST: Stage = "evaluate"
"""The runs end here (what the report reads); registering is not part of a benchmark."""
BASELINES_LAST: Stage = "baselines"
"""A baselines-only seed runs until here; its baselines are then scored without SID models."""
RUN_STAGES = STAGES[: STAGES.index(LAST) + 1]
BASELINE_SECTIONS = ("project", "ingest", "validate", "split", "sasrec", "ease", "evaluate")
"""The resolved settings the baselines' rows depend on (a profile's or preset's values
included: they are resolved into these sections)."""
REFERENCE_EVAL = REPO / "metrics" / "eval.json"
"""The ml-100k ``make run``'s evaluation: the reference of the relative half-width."""
PUBLISHED: dict[str, dict[str, Any]] = {
    "amazon-beauty": {
        "label": "published, their protocol",
        "source": "TIGER (Rajput et al., NeurIPS 2023), Amazon Beauty table: leave-one-out, "
        "full ranking, histories up to 20; its SASRec is trained with a binary loss",
        "rows": {
            "TIGER": {"recall@5": 0.0454, "ndcg@5": 0.0321, "recall@10": 0.0648, "ndcg@10": 0.0384},
            "SASRec": {"recall@10": 0.0605, "ndcg@10": 0.0318},
        },
    },
    "movielens-1m": {
        "label": "published, their protocol",
        "source": "HSTU (Zhai et al., ICML 2024), MovieLens-1M table: leave-one-out, full "
        "ranking, histories up to 200",
        "rows": {
            "SASRec": {"hr@10": 0.2853, "ndcg@10": 0.1603},
            "HSTU": {"hr@10": 0.3097, "ndcg@10": 0.1720},
            "HSTU-large": {"hr@10": 0.3294, "ndcg@10": 0.1893},
        },
    },
}
"""Figures of the published tables whose protocol each built-in profile follows (Recall@K is
HR@K under leave-one-out). They rank items the user has seen too; our rows exclude them."""
PUBLISHED_NOTE = "they rank items the user has already seen too; our rows exclude them"


class Source(NamedTuple):
    """What ``--source`` decides: the run overrides naming it, the dataset and the outputs."""

    overrides: list[str]
    dataset: str
    output: Path
    workdir: Path


def source_of(name: str | None) -> Source:
    """params.yaml's own source (``None`` or its name) keeps its dataset, ``metrics/quality.json``
    and ``bench/runs/quality``; another source is its own dataset, ``metrics/quality-<name>.json``
    and ``bench/runs/quality-<name>`` (its profile applies under ``project.profile: auto``)."""
    settings = load_settings(REPO / "params.yaml")
    if name is None or name == settings.ingest.source:
        output = REPO / settings.paths.metrics("quality")
        return Source([], settings.project.dataset, output, REPO / "bench" / "runs" / "quality")
    overrides = [f"ingest.source={name}", f"project.dataset={name}"]
    load_settings(REPO / "params.yaml", overrides)  # an unknown source fails here, clearly
    return Source(
        overrides,
        name,
        REPO / settings.paths.metrics(f"quality-{name}"),
        REPO / "bench" / "runs" / f"quality-{name}",
    )


def run_folder(workdir: Path, preset: str, seed: int, objective: str | None = None) -> Path:
    name = f"seed-{seed}" if objective is None else f"objective-{objective}-seed-{seed}"
    return workdir / preset / name


def seed_file(seeds_dir: Path, dataset: str, preset: str, seed: int) -> Path:
    return seeds_dir / dataset / preset / f"seed-{seed}.json"


def carried_state(path: Path) -> Path:
    """Where a seed's unfinished SASRec training state travels between sessions: beside its
    seed file ``path`` (``seed-<s>.sasrec-resume.pt``), committed like it."""
    return path.with_name(f"{path.stem}.sasrec-resume.pt")


def resume_file(folder: Path, overrides: list[str]) -> Path:
    """The baselines stage's SASRec resume file in a run folder."""
    return folder_settings(folder, overrides).paths.sasrec_resume


def carry_out(folder: Path, path: Path, overrides: list[str]) -> str | None:
    """Copy the run folder's SASRec training state (the baselines stage's resume file) beside
    the seed file ``path``; what was copied, or None where there is none (not started, or
    the stage finished)."""
    state = resume_file(folder, overrides)
    if not state.exists():
        return None
    with atomic_path(carried_state(path)) as tmp:
        shutil.copyfile(state, tmp)
    return f"{state} -> {carried_state(path)}"


def carry_in(folder: Path, path: Path, overrides: list[str]) -> None:
    """Put a carried SASRec training state into a run folder that has none, so its baselines
    stage goes on after the carried epoch (where the state is of the same run: settings, data)."""
    carried = carried_state(path)
    state = resume_file(folder, overrides)
    if carried.exists() and not state.exists():
        state.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(carried, state)
        print(f"SASRec goes on from {carried}", file=sys.stderr, flush=True)


def run_overrides(preset: str, seed: int, overrides: list[str]) -> list[str]:
    """A run's ``section.key=value`` list: the preset, the user's overrides, then the seed."""
    return [f"{PRESET_KEY}={preset}", *overrides, f"project.seed={seed}"]


def shown(path: Path) -> str:
    """``path`` relative to the repo where it lies inside it (what quality.json records)."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


class SeedRun(NamedTuple):
    """One seed's result: its seed file (or run folder), record, test report and per-user test
    scores (``model``, ``user_id`` and METRICS columns)."""

    folder: Path
    record: dict[str, Any]
    report: dict[str, Any]
    users: pd.DataFrame

    @property
    def generative(self) -> bool:
        return self.report.get("best_generative") is not None


def load_seed_run(folder: Path) -> SeedRun:
    """A finished generative run folder: its record, ``metrics/eval.json`` and test scores."""
    record = run_record(folder, RERUN_HINT)
    paths = folder_paths(folder, record["dataset"])
    report = read_json(
        paths.metrics("eval"), "eval metrics", f"the run has no evaluate; {RERUN_HINT}"
    )
    if not paths.eval_users.exists():
        raise InputError(f"per-user scores not found; {RERUN_HINT}", path=paths.eval_users)
    users = pd.read_parquet(paths.eval_users, columns=["split", "model", "user_id", *METRICS])
    return SeedRun(folder, record, report, users[users["split"] == "test"])


def score_baselines(folder: Path, overrides: list[str]) -> SeedRun:
    """Score the baselines of a run folder finished until :data:`BASELINES_LAST` (no SID model),
    as evaluate scores them; the seconds it took are added to the record as ``evaluate``."""
    from tasks.evaluate import score_models

    record = run_record(folder, RERUN_HINT)
    started = time.perf_counter()
    report, users = score_models(folder_settings(folder.resolve(), overrides), generative=False)
    record = {
        **record,
        "seconds": {**record["seconds"], LAST: round(time.perf_counter() - started, 1)},
    }
    return SeedRun(folder, record, report, users[users["split"] == "test"])


def seed_result(run: SeedRun) -> dict[str, Any]:
    """What a seed file keeps: the run's record (without its folder), the test means and the
    models picked on validation, the protocol, and per model the test users (by position in
    the split's test order, which every seed shares) whose target ranked within the top
    :data:`TOP`, with that rank (1-based), as ``"user:rank user:rank …"``: enough to rebuild
    HR@10 and NDCG@10 per user."""
    test = run.users
    order = test.loc[test["model"] == "popularity", "user_id"].astype(str).tolist()
    hits: dict[str, str] = {}
    for model, rows in test.groupby("model", sort=False):
        ndcg = rows[RATIO_METRIC].to_numpy()
        if rows["user_id"].astype(str).tolist() != order:
            raise InputError(f"{model}'s test rows are not in the users' order", path=run.folder)
        hit = np.flatnonzero(ndcg > 0)
        ranks = np.rint(2.0 ** (1.0 / ndcg[hit]) - 1.0).astype(int)  # ndcg = 1 / log2(rank + 1)
        hits[str(model)] = " ".join(f"{u}:{r}" for u, r in zip(hit, ranks, strict=True))
    report = run.report
    return {
        "record": {  # the repo's own path written as <repo>: seed files merge across clones
            **run.record,
            "overrides": [o.replace(str(REPO), "<repo>") for o in run.record["overrides"]],
        },
        "test_users": len(order),
        "test_users_sha256": hashlib.sha256("\n".join(order).encode()).hexdigest(),
        "best_generative": report.get("best_generative"),
        "best_baseline": report["best_baseline"],
        "test": {m: {k: row[k] for k in METRICS} for m, row in report["test"].items()},
        "protocol": {k: v for k, v in report["protocol"].items() if k != "fingerprints"},
        "hits": hits,
    }


def read_seed_file(path: Path) -> SeedRun:
    """A seed file back as a :class:`SeedRun` (per-user scores rebuilt from the hits)."""
    data = read_json(path, "quality seed file", RERUN_HINT)
    n = int(data["test_users"])
    frames = []
    for model, hits in data["hits"].items():
        rank = np.full(n, TOP + 1)
        for pair in hits.split():
            user, r = pair.split(":")
            rank[int(user)] = int(r)
        within = rank <= TOP
        frames.append(
            pd.DataFrame(
                {
                    "model": model,
                    "user_id": np.arange(n),
                    "hr@10": within.astype(float),
                    "ndcg@10": np.where(within, 1.0 / np.log2(rank + 1.0), 0.0),
                }
            )
        )
    report = {
        "test": data["test"],
        "best_generative": data["best_generative"],
        "best_baseline": data["best_baseline"],
        "test_rows": n,
        "test_users_sha256": data["test_users_sha256"],
        "protocol": data["protocol"],
        "settings_sha256": data.get("settings_sha256"),
        "baselines_sha256": data.get("baselines_sha256"),
    }
    return SeedRun(path, data["record"], report, pd.concat(frames, ignore_index=True))


def seed_runs(seeds_dir: Path, dataset: str, preset: str) -> list[SeedRun]:
    """Every seed file of ``dataset`` and ``preset``, by seed: they must share the settings the
    baselines depend on and their test users, and the generative ones all their settings."""
    folder = seeds_dir / dataset / preset
    paths = sorted(folder.glob("seed-*.json"), key=lambda f: int(f.stem.removeprefix("seed-")))
    if not paths:
        raise InputError(f"no seed files of preset {preset}; {RERUN_HINT}", path=folder)
    runs = [read_seed_file(f) for f in paths]
    generative = [r for r in runs if r.generative]
    for group, key, what in (
        (runs, "baselines_sha256", "the settings its baselines depend on"),
        (generative, "settings_sha256", "its settings"),
    ):
        for run in group[1:]:
            if run.report[key] != group[0].report[key]:
                raise InputError(
                    f"{what} differ from those of {group[0].folder.name} (overrides "
                    f"{run.record['overrides']} and {group[0].record['overrides']}, or another "
                    "params.yaml): rerun it with today's settings, or remove it",
                    path=run.folder,
                )
    for run in runs[1:]:
        if run.report["test_users_sha256"] != runs[0].report["test_users_sha256"]:
            raise InputError(
                f"test users differ from those of {runs[0].folder.name}: the paired interval "
                "needs every seed scored on the same users (same split and evaluate.max_users)",
                path=run.folder,
            )
    return runs


def first_generative(runs: list[SeedRun]) -> int | None:
    """The first seed with SID models (its SFT curves are the ones drawn)."""
    return next((r.record["seed"] for r in runs if r.generative), None)


def spread(values: list[float]) -> dict[str, Any]:
    """Mean and sample sd over seeds (sd null for one seed), and the values per seed."""
    sd = statistics.stdev(values) if len(values) > 1 else None
    return {
        "mean": round(statistics.fmean(values), 6),
        "sd": None if sd is None else round(sd, 6),
        "per_seed": values,
    }


def summarize_preset(
    runs: list[SeedRun], *, resamples: int, target: float | None = None
) -> dict[str, Any]:
    """Per model mean ± sd over the seeds that ran it; over the generative seeds best generative
    / best baseline and / SASRec (against ``target``, if any) with their paired intervals and
    GRPO − SFT; minutes per stage and the machine (from the first run's record)."""
    generative = [r for r in runs if r.generative]
    models = list(dict.fromkeys(m for r in runs for m in r.report["test"]))
    for model in models:
        ran = generative if model in ("sft", "grpo") else runs
        missing = [r.folder.name for r in ran if model not in r.report["test"]]
        if missing:
            raise InputError(
                f"{', '.join(missing)} did not evaluate {model}: every seed must evaluate the same "
                "models (same grpo.enabled; EASE within its catalog limit)",
                path=runs[0].folder,
            )
    table = {
        model: {
            m: spread([r.report["test"][model][m] for r in runs if model in r.report["test"]])
            for m in METRICS
        }
        for model in models
    }
    best = [r.report["best_generative"] for r in generative]
    if generative:
        table[BEST] = {
            m: spread([r.report["test"][b][m] for r, b in zip(generative, best, strict=True)])
            for m in METRICS
        }
    baselines = [r.report["best_baseline"] for r in runs]
    table[BEST_BASELINE] = {
        m: spread([r.report["test"][b][m] for r, b in zip(runs, baselines, strict=True)])
        for m in METRICS
    }
    timed = generative or runs  # a generative seed's record holds every stage's seconds
    stages = list(dict.fromkeys(s for r in timed for s in r.record["seconds"]))
    minutes, left_out = {}, {}
    for stage in stages:
        ran = [r for r in timed if stage in r.record["seconds"]]
        whole = [r for r in ran if stage not in r.record.get("resumed", {})] or ran
        left_out.update(
            {
                f"{stage}, seed {r.record['seed']}": r.record["resumed"][stage]
                for r in ran
                if r not in whole
            }
        )
        minutes[stage] = round(statistics.fmean(r.record["seconds"][stage] for r in whole) / 60, 2)
    if generative:
        minutes["total"] = round(sum(minutes.values()), 2)
    record = timed[0].record
    return {
        "seeds": [r.record["seed"] for r in runs],
        "generative_seeds": [r.record["seed"] for r in generative],
        "runs": [shown(r.folder) for r in runs],
        "test_users": int(runs[0].report["test_rows"]),
        "best_generative": best,
        "best_baseline": baselines,
        "history": (generative or runs)[0].report["protocol"].get("history"),
        "models": table,
        "best_generative_vs_best_baseline": (
            best_vs(generative, best, BEST_BASELINE, resamples) if generative else None
        ),
        "best_generative_vs_sasrec": (
            best_vs(generative, best, "sasrec", resamples, target) if generative else None
        ),
        "grpo_minus_sft": grpo_minus_sft(generative, resamples) if generative else None,
        "minutes": minutes,
        "minutes_over": "the generative seeds" if generative else "the seeds",
        "minutes_resumed": left_out,
        "machines": sorted({cpu for r in runs if (cpu := r.record["machine"].get("cpu"))}),
        "machine": record["machine"],
        "prepared_on": record.get("prepared_on"),
    }


def per_seed(runs: list[SeedRun], models: list[list[str]]) -> list[np.ndarray]:
    """Per test user and seed, each model's ``RATIO_METRIC``: one users x seeds array per model
    column of ``models`` (``models[seed][column]``; the best models differ by seed), every
    array in the same user order."""

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


def best_vs(
    runs: list[SeedRun],
    best: list[str],
    reference: str,
    resamples: int,
    target: float | None = None,
) -> dict[str, Any]:
    """Ratio of the seed-averaged test means, best generative over ``reference`` (``sasrec``, or
    :data:`BEST_BASELINE`: each seed's own), with the paired bootstrap over users (one resample
    of users for every seed and both models); against the best baseline also the difference's
    interval and its half-width relative to the best baseline's mean."""
    references = [
        r.report["best_baseline"] if reference == BEST_BASELINE else reference for r in runs
    ]
    pairs = [[b, ref] for b, ref in zip(best, references, strict=True)]
    best_seeds, ref_seeds = per_seed(runs, pairs)
    best_mean, ref_mean = best_seeds.mean(axis=1), ref_seeds.mean(axis=1)
    interval = paired_ratio_interval(
        best_mean, ref_mean, confidence=CONFIDENCE, n_resamples=resamples
    )
    out: dict[str, Any] = {
        "metric": RATIO_METRIC,
        "reference": references,
        "ratio": round(interval.mean, 4),
        "low": round(interval.low, 4),
        "high": round(interval.high, 4),
        "confidence": CONFIDENCE,
        "resamples": resamples,
    }
    if reference == "sasrec":
        out |= {"target": target, "met": None if target is None else interval.mean >= target}
    else:
        diff = paired_bootstrap_interval(
            best_mean, ref_mean, confidence=CONFIDENCE, n_resamples=resamples
        )
        half = (diff.high - diff.low) / 2
        out |= {
            "diff": round(diff.mean, 5),
            "diff_low": round(diff.low, 5),
            "diff_high": round(diff.high, 5),
            "relative_half_width": round(half / float(ref_mean.mean()), 4),
        }
    return out | endless_seeds(best_seeds - ref_seeds, float(ref_mean.mean()))


def reference_half_width(path: Path = REFERENCE_EVAL) -> dict[str, Any] | None:
    """The relative half-width of best generative − best baseline on the ml-100k ``make run``
    (its ``metrics/eval.json``: one seed, paired bootstrap over the test users), the yardstick
    the new datasets' intervals are held against; None where the file or its rows are missing."""
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    baseline = report.get("best_baseline")
    diff = report.get("paired", {}).get("test", {}).get(f"{BEST} - {BEST_BASELINE}")
    if baseline is None or diff is None:
        return None
    ndcg = diff[RATIO_METRIC]
    half = (ndcg["high"] - ndcg["low"]) / 2
    return {
        "source": shown(path),
        "dataset": report["dataset"],
        "best_baseline": baseline,
        "relative_half_width": round(half / report["test"][baseline][RATIO_METRIC], 4),
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
    seeds_dir: Path,
    dataset: str,
    presets: list[str],
    *,
    resamples: int,
    workdir: Path | None = None,
    objectives: Sequence[str] = (),
) -> dict[str, Any]:
    """The report's content, read from every seed file of ``dataset`` and each preset under
    ``seeds_dir`` (SFT curves from the run folders under ``workdir``, on the first generative
    seed), with the dataset's published figures and the ml-100k half-width reference."""
    report: dict[str, Any] = {"dataset": dataset, "presets": {}, "objectives": {}}
    for preset in presets:
        runs = seed_runs(seeds_dir, dataset, preset)
        target = TARGETS.get(preset) if dataset == TARGETS_DATASET else None
        report["presets"][preset] = summarize_preset(runs, resamples=resamples, target=target)
        first = first_generative(runs)
        if objectives and workdir is not None and first is not None:
            report["objectives"][preset] = {
                o: sft_curve(objective_folder(workdir, preset, first, o)) for o in objectives
            }
    if dataset in PUBLISHED:
        report["published"] = {**PUBLISHED[dataset], "note": PUBLISHED_NOTE}
    report["reference_half_width"] = reference_half_width()
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
    """The printed output: per preset the models table, the comparisons and minutes per stage;
    the published figures; then SFT per objective."""
    lines = []
    for preset, p in report["presets"].items():
        lines += _preset_table(report["dataset"], preset, p)
        for name, reference in (
            ("best_generative_vs_best_baseline", "the best baseline"),
            ("best_generative_vs_sasrec", "SASRec"),
        ):
            r = p[name]
            if r is None:
                continue
            verdict = (
                ""
                if r.get("target") is None
                else f"; target >= {r['target']:.2f}x: " + ("met" if r["met"] else "NOT met")
            )
            detail = (
                f"; difference {r['diff']:+.4f} [{r['diff_low']:+.4f}, {r['diff_high']:+.4f}], "
                f"half-width {r['relative_half_width']:.3f}x the best baseline"
                if "diff" in r
                else ""
            )
            lines += [
                f"best generative / {reference} test NDCG@10: {r['ratio']:.3f}x [{r['low']:.3f}, "
                f"{r['high']:.3f}] (paired bootstrap over users, {r['confidence']:.0%})"
                f"{detail}{verdict}" + _endless(r, reference),
                "",
            ]
        ref = report.get("reference_half_width")
        vs = p["best_generative_vs_best_baseline"]
        if ref is not None and vs is not None and report["dataset"] != ref["dataset"]:
            lines += [
                f"relative half-width {vs['relative_half_width']:.3f} here against "
                f"{ref['relative_half_width']:.3f} on {ref['dataset']} ({ref['source']}): "
                f"{vs['relative_half_width'] / ref['relative_half_width']:.2f}x",
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
            f"| minutes (mean over {p['minutes_over']}) | " + " | ".join(p["minutes"]) + " |",
            "|---|" + "---|" * len(p["minutes"]),
            "| | " + " | ".join(f"{v:.1f}" for v in p["minutes"].values()) + " |",
            "",
        ]
        if p.get("minutes_resumed"):
            lines += [
                "left out of the minutes (the stage went on from a resume file after the epoch "
                "given, so its time covers the later epochs only): "
                + ", ".join(f"{k} (after epoch {v})" for k, v in p["minutes_resumed"].items()),
                "",
            ]
    if "published" in report:
        lines += _published_table(report["published"])
    for preset, curves in report["objectives"].items():
        lines += [
            f"**SFT objectives, preset {preset}** (first generative seed)",
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


def _cpus(models: list[str]) -> str:
    """The processors the seeds ran on, where the records name them (older ones do not)."""
    if not models:
        return ""
    return (
        f"; CPU {models[0]}" if len(models) == 1 else f"; CPUs (seeds differ) {', '.join(models)}"
    )


def _preset_table(dataset: str, preset: str, p: dict[str, Any]) -> list[str]:
    """The preset's heading (data, seeds, machine, history read) and its models table."""
    m = p["machine"]
    prepared = p.get("prepared_on")
    before = (
        ""
        if prepared is None
        else f" (the stages until {prepared['until']} on {prepared['machine']['cpus']} CPUs, "
        f"GPU {prepared['machine']['gpu'] or 'none'})"
    )
    generative = ", ".join(map(str, p["generative_seeds"])) or "none"
    lines = [
        f"**preset {preset}** — {dataset}, {p['test_users']} test users, mean ± sd over seeds "
        f"{', '.join(map(str, p['seeds']))} (SID models: seeds {generative}); {m['cpus']} CPUs, "
        f"{m['torch_threads']} torch threads, GPU {m['gpu'] or 'none'}{before}"
        + _cpus(p.get("machines", [])),
        "",
    ]
    history = p.get("history")
    if history is not None:
        read = (
            f"history read: protocol {history['protocol_items']} items, SASRec "
            f"{history['sasrec_items']}, EASE {history['ease_items']}"
        )
        g = history.get("generative")
        if g is not None:
            context = g["context_items"] or "as many as fit"
            read += f", SID models {context} (their context, {g['context_tokens']} tokens)"
        lines += [read, ""]
    lines += ["| model (test) | seeds | HR@10 | NDCG@10 |", "|---|---|---|---|"]
    for model, row in p["models"].items():
        name = model
        if model == BEST:
            name = f"{model} ({', '.join(p['best_generative'])})"
        elif model == BEST_BASELINE:
            name = f"{model} ({', '.join(p['best_baseline'])})"
        seeds = len(row[METRICS[0]]["per_seed"])
        lines.append(
            f"| {name} | {seeds} | " + " | ".join(_mean_sd(row[k]) for k in METRICS) + " |"
        )
    return [*lines, ""]


def _published_table(published: dict[str, Any]) -> list[str]:
    """The published figures, in a table of their own under their label."""
    metrics = list(dict.fromkeys(k for row in published["rows"].values() for k in row))
    lines = [
        f"**{published['label']}** — {published['source']} ({published['note']})",
        "",
        "| model | " + " | ".join(metrics) + " |",
        "|---|" + "---|" * len(metrics),
    ]
    for model, row in published["rows"].items():
        cells = [f"{row[k]:.4f}" if k in row else "" for k in metrics]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def tracked_metrics(report: dict[str, Any]) -> dict[str, float]:
    """What the MLflow run records: per preset, model and metric the mean over seeds, and the
    comparisons' ratios and differences."""
    metrics = {}
    for preset, p in report["presets"].items():
        for name, key in (
            ("best_generative_vs_best_baseline", "best_generative_over_best_baseline"),
            ("best_generative_vs_sasrec", "best_generative_over_sasrec"),
        ):
            if p[name] is not None:
                metrics[f"{preset}.{key}"] = p[name]["ratio"]
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
    parser.add_argument(
        "--source", help="a built-in source (default: params.yaml's, ml-100k's movielens-100k)"
    )
    parser.add_argument("--presets", "--preset", nargs="+", default=["default", "quality"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--generative-seeds",
        nargs="*",
        type=int,
        help="the seeds that train SID models (default: every seed); the others run the "
        "baselines alone",
    )
    parser.add_argument("--objectives", nargs="*", default=[], help="e.g. sequence rows")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )
    parser.add_argument("--workdir", type=Path, help="default: bench/runs/quality[-<source>]")
    parser.add_argument("--seeds-dir", type=Path, default=SEEDS_DIR, help="the seed files' root")
    parser.add_argument("--skip-run", action="store_true", help="only read the seed files")
    parser.add_argument(
        "--carry-out",
        action="store_true",
        help="copy each seed's unfinished SASRec training state beside its seed file (commit "
        "it: a later run there goes on from it), then stop; safe beside a running bench",
    )
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap replicates")
    parser.add_argument("--output", type=Path, help="default: metrics/quality[-<source>].json")
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


def seed_digests(folder: Path, overrides: list[str]) -> dict[str, str]:
    """A seed file's two settings digests, both without the seed (so seeds compare): all the
    resolved settings, and those the baselines depend on (:data:`BASELINE_SECTIONS`)."""
    any_seed = [*overrides, "project.seed=0"]
    return {
        "settings_sha256": settings_digest(folder, any_seed),
        "baselines_sha256": settings_digest(folder, any_seed, BASELINE_SECTIONS),
    }


def seed_is_current(path: Path, folder: Path, overrides: list[str], generative: bool) -> bool:
    """Whether ``path`` holds this seed's result with today's settings: all of them where
    ``generative`` asks for SID models; else those the baselines depend on (a change of SFT's
    settings keeps them), in a file whose SID rows, if any, are current too. Then nothing runs."""
    if not path.exists():
        return False
    data = json.loads(path.read_text())
    digests = seed_digests(folder, overrides)
    same = data.get("settings_sha256") == digests["settings_sha256"]
    if generative:
        return same and data["best_generative"] is not None
    baselines = data.get("baselines_sha256") == digests["baselines_sha256"]
    return baselines and (same or data["best_generative"] is None)


def run_seed(
    folder: Path, path: Path, overrides: list[str], generative: bool, start: Stage, until: Stage
) -> None:
    """Run one seed's stages in ``folder`` (a baselines-only seed stops after the baselines)
    and, for a run that reached evaluate, write its seed file ``path``."""
    last = (
        until
        if generative or STAGES.index(until) < STAGES.index(BASELINES_LAST)
        else BASELINES_LAST
    )
    ensure_run(folder, overrides, last, start=start)
    if until != LAST:
        return
    run = load_seed_run(folder) if generative else score_baselines(folder, overrides)
    atomic_write_json(path, {**seed_result(run), **seed_digests(folder, overrides)})


def run_all(args: argparse.Namespace, source: Source, workdir: Path, overrides: list[str]) -> None:
    """Every preset's seeds (and SFT objective runs) that have no current seed file."""
    generative = set(args.seeds if args.generative_seeds is None else args.generative_seeds)
    for preset in args.presets:  # a bad preset, objective or --set fails before training
        run = run_overrides(preset, args.seeds[0], overrides)
        for extra in [[], *([f"sft.objective={o}"] for o in args.objectives)]:
            folder_settings(workdir, [*run, *extra])
    for preset in args.presets:
        for seed in args.seeds:
            run = run_overrides(preset, seed, overrides)
            folder = run_folder(workdir, preset, seed)
            path = seed_file(args.seeds_dir, source.dataset, preset, seed)
            if not seed_is_current(path, folder, run, seed in generative):
                carry_in(folder, path, run)
                run_seed(folder, path, run, seed in generative, args.start, args.until)
            if path.exists():
                carried_state(path).unlink(missing_ok=True)
        if args.until != LAST or not args.objectives:
            continue
        first = first_generative(seed_runs(args.seeds_dir, source.dataset, preset))
        if first is None:
            continue
        for objective in args.objectives:  # the preset's own run where it trained this one
            folder = objective_folder(workdir, preset, first, objective)
            if folder != run_folder(workdir, preset, first):
                run = run_overrides(preset, first, overrides)
                ensure_run(folder, [*run, f"sft.objective={objective}"], "sft")


def main() -> None:
    args = bench_args(__doc__, _options)
    source = source_of(args.source)
    workdir = (args.workdir or source.workdir).resolve()
    overrides = [*source.overrides, f"embed.cache_dir={workdir / 'cache'}", *args.overrides]
    output = args.output or source.output
    plot = plot_path(args.output)
    if args.carry_out:
        for preset in args.presets:
            for seed in args.seeds:
                run = run_overrides(preset, seed, overrides)
                path = seed_file(args.seeds_dir, source.dataset, preset, seed)
                copied = carry_out(run_folder(workdir, preset, seed), path, run)
                print(copied or f"{preset} seed {seed}: no unfinished SASRec training state")
        return
    if not args.skip_run:
        run_all(args, source, workdir, overrides)
        if args.until != LAST:
            print(f"prepared until {args.until} under {workdir}; no report before evaluate")
            return
    report = build_report(
        args.seeds_dir,
        source.dataset,
        args.presets,
        resamples=args.resamples,
        workdir=workdir,
        objectives=args.objectives,
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
