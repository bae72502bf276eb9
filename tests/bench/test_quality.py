"""bench/quality.py on run folders and seed files written by the test (known numbers; nothing
trains): the seed files' round trip, means and sds over seeds, generative and baselines-only
seeds mixed, best generative / best baseline and / SASRec with their paired intervals, GRPO −
SFT, the published figures and the half-width reference, the JSON, the tables, the SFT curves
and plot, which seeds run again, and the errors for missing or mismatched runs."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import bench.common
import bench.quality
import tasks.evaluate
from bench.common import (
    REPO,
    RUN_RECORD,
    StagesRun,
    ensure_run,
    folder_paths,
    folder_settings,
    settings_digest,
)
from bench.quality import (
    BEST,
    BEST_BASELINE,
    METRICS,
    PLOT,
    PUBLISHED_NOTE,
    TARGETS_DATASET,
    Source,
    build_report,
    carried_state,
    carry_out,
    load_seed_run,
    objective_folder,
    plot_curves,
    plot_path,
    read_seed_file,
    reference_half_width,
    run_all,
    run_folder,
    run_overrides,
    seed_digests,
    seed_file,
    seed_is_current,
    seed_result,
    seed_runs,
    source_of,
    tables,
    tracked_metrics,
)
from models.stats import seed_noise
from sidrec.config import load_settings
from sidrec.errors import ConfigError, InputError
from sidrec.io import atomic_write_json
from sidrec.paths import DatasetPaths
from sidrec.stage import STAGES, Stage

Scores = dict[str, dict[str, np.ndarray]]

DATASET = TARGETS_DATASET  # ml-100k: the dataset the presets' targets are for
BASELINES = ("popularity", "sasrec", "ease")
MODELS = (*BASELINES, "sft", "grpo")
SEEDS = (0, 1, 2)
USERS = [f"u{i}" for i in range(60)]
BEST_PER_SEED = {0: "grpo", 1: "grpo", 2: "sft"}
BASELINE_PER_SEED = {0: "sasrec", 1: "ease", 2: "sasrec"}
"""What evaluate picked on validation, per seed (not the better one on test at seed 2)."""
SECONDS = {"ingest": 6.0, "baselines": 12.0, "sft": 120.0, "evaluate": 30.0}
MINUTES = {"ingest": 0.1, "baselines": 0.2, "sft": 2.0, "evaluate": 0.5, "total": 2.8}
BASELINES_SECONDS = {"ingest": 9.0, "baselines": 18.0, "evaluate": 3.0}
MACHINE = {"cpus": 2, "torch_threads": 2, "gpu": None, "platform": "test", "torch": "x"}
HISTORY = {"protocol_items": 50, "sasrec_items": 50, "ease_items": 50}
SID_HISTORY = {"context_tokens": 128, "context_items": 31}


def user_scores(seed: int, models: tuple[str, ...] = MODELS, users: list[str] = USERS) -> Scores:
    """Per model the per-user test hr@10 (0/1) and ndcg@10 (1 / log2(rank + 1) of a rank within
    the top 10) of one seed; a model's numbers do not depend on which others ran."""
    rng = np.random.default_rng(seed)
    rates = {"popularity": 0.1, "sasrec": 0.3, "ease": 0.28, "sft": 0.2, "grpo": 0.25}
    scores = {}
    for model in MODELS:
        hit = rng.random(len(users)) < rates[model]
        ndcg = np.where(hit, 1.0 / np.log2(rng.integers(1, 11, len(users)) + 1.0), 0.0)
        if model in models:
            scores[model] = {"hr@10": hit.astype(float), "ndcg@10": ndcg}
    return scores


def eval_outputs(
    seed: int, models: tuple[str, ...] = MODELS, users: list[str] = USERS
) -> tuple[dict[str, Any], pd.DataFrame, Scores]:
    """What evaluate (``score_models``) makes of ``models``: eval.json, the per-user frame."""
    scores = user_scores(seed, models, users)
    frames = [
        pd.DataFrame({"split": "test", "model": m, "user_id": users, **s})
        for m, s in scores.items()
    ]
    frames.append(pd.DataFrame({"split": "valid", "model": "sasrec", "user_id": ["v"]}))
    g = "sft" in models
    best = (BEST_PER_SEED[seed] if BEST_PER_SEED[seed] in models else "sft") if g else None
    history = HISTORY | ({"generative": SID_HISTORY} if g else {})
    report: dict[str, Any] = {
        "test": {m: {k: float(v.mean()) for k, v in s.items()} for m, s in scores.items()}
    }
    report |= {"best_generative": best, "best_baseline": BASELINE_PER_SEED[seed]}
    report |= {"test_rows": len(users), "protocol": {"history": history, "fingerprints": {}}}
    return report, pd.concat(frames, ignore_index=True), scores


def write_eval(
    paths: DatasetPaths, seed: int, models: tuple[str, ...] = MODELS, users: list[str] = USERS
) -> Scores:
    report, frame, scores = eval_outputs(seed, models, users)
    paths.metrics_dir.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(paths.eval_users)
    atomic_write_json(paths.metrics("eval"), report)
    return scores


def write_run(
    folder: Path,
    seed: int,
    models: tuple[str, ...] = MODELS,
    users: list[str] = USERS,
    overrides: tuple[str, ...] = (),
) -> Scores:
    """A finished run as ``ensure_run`` + evaluate leave it (until baselines without SID
    models); returns its scores."""
    scores = write_eval(folder_paths(folder, DATASET), seed, models, users)
    run = run_overrides("default", seed, list(overrides))
    g = "sft" in models
    record = {"dataset": DATASET, "seed": seed, "until": "evaluate" if g else "baselines"}
    record |= {"overrides": run, "settings_sha256": settings_digest(folder, run)}
    record |= {"seconds": SECONDS if g else BASELINES_SECONDS, "machine": MACHINE}
    atomic_write_json(folder / RUN_RECORD, record)
    return scores


def write_seed_file(folder: Path, path: Path) -> None:
    """``path`` as ``run_seed`` writes it from the finished run in ``folder``."""
    run = load_seed_run(folder)
    atomic_write_json(path, {**seed_result(run), **seed_digests(folder, run.record["overrides"])})


def write_seeds(
    root: Path,
    seeds: tuple[int, ...] = SEEDS,
    generative: tuple[int, ...] = SEEDS,
    *,
    dataset: str = DATASET,
    models: tuple[str, ...] = MODELS,
    **kwargs: Any,
) -> dict[int, Scores]:
    """Run folders under ``root/runs`` and their seed files under ``root/seeds``."""
    scores = {}
    for s in seeds:
        folder = run_folder(root / "runs", "default", s)
        scores[s] = write_run(folder, s, models if s in generative else BASELINES, **kwargs)
        write_seed_file(folder, seed_file(root / "seeds", dataset, "default", s))
    return scores


def write_sft(folder: Path, objective: str, ndcgs: list[float], *, record: bool = False) -> None:
    """metrics/sft.json: one validation per epoch of 10 steps, 600 s of training in all."""
    paths = folder_paths(folder, DATASET)
    history = [{"step": 10.0 * e, "epoch": float(e), "ndcg@10": v} for e, v in enumerate(ndcgs, 1)]
    best = max(history, key=lambda r: r["ndcg@10"])
    sft = {
        "objective": objective,
        "steps": 10 * len(ndcgs),
        "train_seconds": 600.0,
        "best_epoch": best["epoch"],
        "valid_best": {"ndcg@10": best["ndcg@10"]},
        "valid_history": history,
    }
    atomic_write_json(paths.metrics("sft"), sft)
    if record:
        atomic_write_json(folder / RUN_RECORD, {"dataset": DATASET, "seed": 0, "until": "sft"})


@pytest.fixture
def runs(tmp_path: Path) -> dict[int, Scores]:
    """Three generative seeds of preset default under ``tmp_path``; seed 0 trained the sequence
    objective, a separate run the rows objective."""
    scores, workdir = write_seeds(tmp_path), tmp_path / "runs"
    write_sft(run_folder(workdir, "default", 0), "sequence", [0.02, 0.05, 0.04])
    write_sft(run_folder(workdir, "default", 0, "rows"), "rows", [0.01, 0.03], record=True)
    return scores


def report_of(
    root: Path, objectives: tuple[str, ...] = ("sequence", "rows"), dataset: str = DATASET
) -> Any:
    seeds, runs = root / "seeds", root / "runs"
    return build_report(
        seeds, dataset, ["default"], resamples=300, workdir=runs, objectives=objectives
    )


def stacked(runs: dict[int, Scores], models: dict[int, str]) -> np.ndarray:
    """users x seeds test ndcg@10 of ``models[seed]``."""
    return np.stack([runs[s][m]["ndcg@10"] for s, m in models.items()], axis=1)


def test_a_seed_file_keeps_the_per_user_scores_and_no_path_of_the_repo(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    cache = f"embed.cache_dir={REPO / 'bench' / 'runs' / 'quality' / 'cache'}"
    write_run(folder, 0, overrides=(cache,))
    run = load_seed_run(folder)
    atomic_write_json(path := tmp_path / "seed-0.json", seed_result(run))
    back = read_seed_file(path)
    for model in MODELS:
        rows, before = (r.users[r.users["model"] == model] for r in (back, run))
        assert rows["user_id"].tolist() == list(range(len(USERS)))  # positions in the order
        for k in METRICS:
            np.testing.assert_allclose(rows[k], before[k], rtol=0, atol=1e-9)
    means = {m: {k: run.report["test"][m][k] for k in METRICS} for m in MODELS}
    assert back.report["test"] == means
    assert (back.report["best_generative"], back.report["best_baseline"]) == ("grpo", "sasrec")
    assert back.report["protocol"] == {"history": {**HISTORY, "generative": SID_HISTORY}}
    cache = "embed.cache_dir=<repo>/bench/runs/quality/cache"
    assert back.record["overrides"] == ["project.preset=default", cache, "project.seed=0"]
    assert str(REPO) not in path.read_text()
    users = run.users.copy()  # one model's rows in another order than popularity's
    sasrec = users["model"] == "sasrec"
    users.loc[sasrec, "user_id"] = users.loc[sasrec, "user_id"].to_numpy()[::-1]
    with pytest.raises(InputError, match="sasrec's test rows are not in the users' order"):
        seed_result(run._replace(users=users))


def test_means_and_sds_over_seeds(tmp_path: Path, runs: Any) -> None:
    preset = report_of(tmp_path)["presets"]["default"]
    for model in MODELS:
        for metric in METRICS:
            per_seed = [float(runs[s][model][metric].mean()) for s in SEEDS]
            row = preset["models"][model][metric]
            assert row["per_seed"] == pytest.approx(per_seed, abs=1e-12)
            assert row["mean"] == pytest.approx(np.mean(per_seed), abs=1e-6)
            assert row["sd"] == pytest.approx(statistics.stdev(per_seed), abs=1e-6)
    # best generative: per seed the model evaluate picked on valid, never the better on test
    assert preset["best_generative"] == ["grpo", "grpo", "sft"]
    best = [float(runs[s][BEST_PER_SEED[s]]["ndcg@10"].mean()) for s in SEEDS]
    assert preset["models"][BEST]["ndcg@10"]["mean"] == pytest.approx(np.mean(best), abs=1e-6)
    assert preset["test_users"] == len(USERS)
    assert preset["seeds"] == preset["generative_seeds"] == list(SEEDS)
    assert preset["runs"] == [
        str(seed_file(tmp_path / "seeds", DATASET, "default", s)) for s in SEEDS
    ]
    assert preset["machine"] == MACHINE
    assert preset["history"] == {**HISTORY, "generative": SID_HISTORY}
    assert preset["minutes"] == MINUTES


def test_ratios_are_those_of_the_seed_averaged_means_and_lie_in_their_intervals(
    tmp_path: Path, runs: Any
) -> None:
    preset = report_of(tmp_path)["presets"]["default"]
    assert preset["best_baseline"] == ["sasrec", "ease", "sasrec"]
    for metric in METRICS:  # per seed the baseline picked on the gate half, not the test's best
        per_seed = [float(runs[s][BASELINE_PER_SEED[s]][metric].mean()) for s in SEEDS]
        assert preset["models"][BEST_BASELINE][metric]["per_seed"] == pytest.approx(per_seed)
    best, base = stacked(runs, BEST_PER_SEED), stacked(runs, BASELINE_PER_SEED)
    sasrec = stacked(runs, dict.fromkeys(SEEDS, "sasrec"))
    vs, ratio = preset["best_generative_vs_best_baseline"], preset["best_generative_vs_sasrec"]
    assert vs["reference"] == ["sasrec", "ease", "sasrec"]
    assert vs["ratio"] == pytest.approx(best.mean() / base.mean(), abs=5.1e-5)
    assert vs["diff"] == pytest.approx((best - base).mean(), abs=5.1e-6)
    assert vs["diff_low"] < vs["diff"] < vs["diff_high"]
    half = (vs["diff_high"] - vs["diff_low"]) / 2
    assert vs["relative_half_width"] == pytest.approx(half / base.mean(), abs=2e-4)
    assert ratio["ratio"] == pytest.approx(best.mean() / sasrec.mean(), abs=5.1e-5)
    assert ratio["target"] == 1.0 and ratio["met"] is bool(best.mean() / sasrec.mean() >= 1.0)
    assert "target" not in vs and "diff" not in ratio  # the target is against SASRec
    for r in (vs, ratio):
        assert r["low"] < r["ratio"] < r["high"]
        assert (r["metric"], r["confidence"], r["resamples"]) == ("ndcg@10", 0.95, 300)


def test_grpo_minus_sft_is_the_paired_difference_of_the_seed_averaged_users(
    tmp_path: Path, runs: Any
) -> None:
    report = report_of(tmp_path)
    g = report["presets"]["default"]["grpo_minus_sft"]
    grpo = np.mean([runs[s]["grpo"]["ndcg@10"] for s in SEEDS], axis=0)
    sft = np.mean([runs[s]["sft"]["ndcg@10"] for s in SEEDS], axis=0)
    assert g["diff"] == pytest.approx(float((grpo - sft).mean()), abs=5.1e-6)
    assert g["ratio"] == pytest.approx(float(grpo.mean() / sft.mean()), abs=5.1e-5)
    assert g["low"] < g["diff"] < g["high"]
    assert "GRPO - SFT test NDCG@10: " + f"{g['diff']:+.4f}" in tables(report)


def test_the_comparisons_say_what_endless_seeds_would_leave(tmp_path: Path, runs: Any) -> None:
    preset = report_of(tmp_path)["presets"]["default"]
    best, base = stacked(runs, BEST_PER_SEED), stacked(runs, BASELINE_PER_SEED)
    sasrec, grpo, sft = (stacked(runs, dict.fromkeys(SEEDS, m)) for m in ("sasrec", "grpo", "sft"))
    for name, diffs, reference in [
        ("best_generative_vs_best_baseline", best - base, base),
        ("best_generative_vs_sasrec", best - sasrec, sasrec),
        ("grpo_minus_sft", grpo - sft, sft),
    ]:
        half = seed_noise(diffs).half_width_endless
        assert preset[name]["half_width_endless_seeds"] == pytest.approx(half, abs=5.1e-6)
        assert preset[name]["relative"] == pytest.approx(half / reference.mean(), abs=5.1e-5)
    text = tables(report_of(tmp_path))
    endless = preset["best_generative_vs_sasrec"]["half_width_endless_seeds"]
    assert f"would keep ± {endless:.4f} (± " in text
    assert text.count("which no seed removes") == 3
    write_seeds(tmp_path / "one", seeds=(0,))
    one_seed = report_of(tmp_path / "one", ())
    assert "half_width_endless_seeds" not in one_seed["presets"]["default"]["grpo_minus_sft"]
    assert "which no seed removes" not in tables(one_seed)


def test_without_grpo_there_is_no_grpo_minus_sft(tmp_path: Path) -> None:
    write_seeds(tmp_path, models=(*BASELINES, "sft"))
    preset = report_of(tmp_path, ())["presets"]["default"]
    assert preset["grpo_minus_sft"] is None and preset["best_generative"] == ["sft"] * 3


def test_baselines_only_seeds_count_in_the_baseline_rows_not_in_the_comparisons(
    tmp_path: Path,
) -> None:
    scores = write_seeds(tmp_path, generative=(0,))
    report = report_of(tmp_path, ())
    preset = report["presets"]["default"]
    assert preset["seeds"] == [0, 1, 2] and preset["generative_seeds"] == [0]
    assert preset["best_generative"] == ["grpo"]
    assert preset["best_baseline"] == ["sasrec", "ease", "sasrec"]
    for model in (*BASELINES, BEST_BASELINE):
        assert len(preset["models"][model]["ndcg@10"]["per_seed"]) == 3
    for model in ("sft", "grpo", BEST):
        assert len(preset["models"][model]["ndcg@10"]["per_seed"]) == 1
        assert preset["models"][model]["ndcg@10"]["sd"] is None
    best, base = scores[0]["grpo"]["ndcg@10"], scores[0]["sasrec"]["ndcg@10"]  # seed 0 alone
    vs = preset["best_generative_vs_best_baseline"]
    assert vs["reference"] == ["sasrec"]
    assert vs["ratio"] == pytest.approx(best.mean() / base.mean(), abs=5.1e-5)
    assert vs["diff"] == pytest.approx((best - base).mean(), abs=5.1e-6)
    assert "half_width_endless_seeds" not in vs  # one generative seed
    grpo, sft = scores[0]["grpo"]["ndcg@10"], scores[0]["sft"]["ndcg@10"]
    assert preset["grpo_minus_sft"]["diff"] == pytest.approx((grpo - sft).mean(), abs=5.1e-6)
    assert preset["minutes"] == MINUTES
    text = tables(report)
    assert "over seeds 0, 1, 2 (SID models: seeds 0)" in text
    assert "| sasrec | 3 | " in text and "| grpo | 1 | " in text
    assert f"| {BEST} (grpo) | 1 | " in text
    assert f"| {BEST_BASELINE} (sasrec, ease, sasrec) | 3 | " in text

    write_seeds(tmp_path / "baselines", generative=())
    only = report_of(tmp_path / "baselines", ())["presets"]["default"]
    assert only["generative_seeds"] == [] and BEST not in only["models"]
    assert list(only["models"]) == [*BASELINES, BEST_BASELINE]
    for name in ("best_generative_vs_best_baseline", "best_generative_vs_sasrec", "grpo_minus_sft"):
        assert only[name] is None
    assert only["minutes"] == {"ingest": 0.15, "baselines": 0.3, "evaluate": 0.05}
    text = tables(report_of(tmp_path / "baselines", ()))
    assert "(SID models: seeds none)" in text and "best generative /" not in text
    assert "| minutes (mean over the seeds) | ingest | baselines | evaluate |" in text


def test_seed_files_of_other_settings_or_other_users_are_refused(tmp_path: Path) -> None:
    write_seeds(tmp_path, seeds=(0,))
    write_seeds(tmp_path, seeds=(1,), overrides=("sft.epochs=1",))
    with pytest.raises(InputError, match=r"seed-1\.json: its settings differ .*sft\.epochs=1"):
        seed_runs(tmp_path / "seeds", DATASET, "default")
    # a baselines-only seed of another SFT setting merges: its rows do not depend on SFT
    write_seeds(tmp_path, seeds=(1,), generative=(), overrides=("sft.epochs=1",))
    merged = seed_runs(tmp_path / "seeds", DATASET, "default")
    assert [r.generative for r in merged] == [True, False]
    write_seeds(tmp_path, seeds=(1,), generative=(), overrides=("sasrec.lr=0.01",))
    with pytest.raises(InputError, match=r"seed-1\.json: the settings its baselines depend on"):
        seed_runs(tmp_path / "seeds", DATASET, "default")
    write_seeds(tmp_path, seeds=(1,), users=[*USERS[:-1], "someone else"])
    with pytest.raises(InputError, match=r"seed-1\.json: test users differ from those of seed-0"):
        seed_runs(tmp_path / "seeds", DATASET, "default")
    write_seeds(tmp_path, seeds=(1,))
    assert [r.record["seed"] for r in seed_runs(tmp_path / "seeds", DATASET, "default")] == [0, 1]
    path = seed_file(tmp_path / "seeds", DATASET, "default", 1)
    data = json.loads(path.read_text())
    del data["test"]["ease"]
    atomic_write_json(path, data)
    with pytest.raises(InputError, match="seed-1.json did not evaluate ease"):
        report_of(tmp_path, ())


def test_published_figures_stand_apart_under_their_label(tmp_path: Path) -> None:
    write_seeds(tmp_path, seeds=(0,), dataset="amazon-beauty")
    report = report_of(tmp_path, (), dataset="amazon-beauty")
    published = report["published"]
    assert published["label"] == "published, their protocol"
    assert published["rows"]["TIGER"]["ndcg@10"] == 0.0384 and published["note"] == PUBLISHED_NOTE
    assert "TIGER" not in report["presets"]["default"]["models"]  # never mixed into our rows
    sasrec = report["presets"]["default"]["best_generative_vs_sasrec"]
    assert sasrec["target"] is None and sasrec["met"] is None  # the targets are ml-100k's
    text = tables(report)
    assert "**published, their protocol** — TIGER (Rajput et al." in text
    assert "| model | recall@5 | ndcg@5 | recall@10 | ndcg@10 |" in text
    assert "| TIGER | 0.0454 | 0.0321 | 0.0648 | 0.0384 |" in text
    assert "| SASRec |  |  | 0.0605 | 0.0318 |" in text
    write_seeds(tmp_path / "ml", seeds=(0,))
    report = report_of(tmp_path / "ml", ())
    assert "published" not in report and "published, their protocol" not in tables(report)


def test_the_reference_half_width_is_that_of_the_make_runs_difference(tmp_path: Path) -> None:
    path = tmp_path / "eval.json"
    assert reference_half_width(path) is None
    report = {"dataset": "ml-100k", "best_baseline": "blend", "test": {"blend": {"ndcg@10": 0.1}}}
    atomic_write_json(path, report)
    assert reference_half_width(path) is None  # an eval.json from before the best baseline
    diff = {"ndcg@10": {"mean": 0.01, "low": -0.004, "high": 0.026}}
    atomic_write_json(path, {**report, "paired": {"test": {f"{BEST} - {BEST_BASELINE}": diff}}})
    expected = {"source": str(path), "dataset": "ml-100k", "best_baseline": "blend"}
    assert reference_half_width(path) == expected | {"relative_half_width": 0.15}  # 0.015 / 0.1


def test_the_json_holds_every_section_and_round_trips(tmp_path: Path, runs: Any) -> None:
    report = report_of(tmp_path)
    atomic_write_json(tmp_path / "quality.json", report)
    assert json.loads((tmp_path / "quality.json").read_text()) == report
    assert report["dataset"] == DATASET
    assert set(report) == {"dataset", "presets", "objectives", "reference_half_width"}
    keys = {"seeds", "generative_seeds", "runs", "test_users", "best_generative", "best_baseline"}
    keys |= {"history", "models", "best_generative_vs_best_baseline", "best_generative_vs_sasrec"}
    keys |= {"grpo_minus_sft", "minutes", "minutes_over", "minutes_resumed", "machine"}
    keys |= {"machines", "prepared_on"}
    assert set(report["presets"]["default"]) == keys
    assert list(report["presets"]["default"]["models"]) == [*MODELS, BEST, BEST_BASELINE]
    assert set(report["objectives"]["default"]) == {"sequence", "rows"}
    metrics, preset = tracked_metrics(report), report["presets"]["default"]
    for name, key in [
        ("best_generative_vs_best_baseline", "best_generative_over_best_baseline"),
        ("best_generative_vs_sasrec", "best_generative_over_sasrec"),
    ]:
        assert metrics[f"default.{key}"] == pytest.approx(preset[name]["ratio"])
    assert metrics["default.grpo_minus_sft"] == pytest.approx(preset["grpo_minus_sft"]["diff"])
    assert not any("@" in key for key in metrics)


def test_tables_show_mean_sd_comparisons_history_and_minutes(
    tmp_path: Path, runs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = {"source": "metrics/eval.json", "dataset": "ml-ref", "relative_half_width": 0.2}
    monkeypatch.setattr(bench.quality, "reference_half_width", lambda: reference)
    report = report_of(tmp_path)
    text, preset = tables(report), report["presets"]["default"]
    hr, ndcg = (preset["models"]["sasrec"][k] for k in METRICS)
    assert f"| sasrec | 3 | {hr['mean']:.4f} ± {hr['sd']:.4f} | {ndcg['mean']:.4f} ± " in text
    assert f"| {BEST} (grpo, grpo, sft) | 3 |" in text
    assert f"| {BEST_BASELINE} (sasrec, ease, sasrec) | 3 |" in text
    assert "history read: protocol 50 items, SASRec 50, EASE 50, SID models 31 (their " in text
    for name, reference_name in [
        ("best_generative_vs_sasrec", "SASRec"),
        ("best_generative_vs_best_baseline", "the best baseline"),
    ]:
        r = preset[name]
        assert (
            f"best generative / {reference_name} test NDCG@10: {r['ratio']:.3f}x "
            f"[{r['low']:.3f}, {r['high']:.3f}]" in text
        )
    vs = preset["best_generative_vs_best_baseline"]
    assert f"; difference {vs['diff']:+.4f} [{vs['diff_low']:+.4f}, " in text
    assert f"half-width {vs['relative_half_width']:.3f}x the best baseline" in text
    ratio = preset["best_generative_vs_sasrec"]
    assert "target >= 1.00x: " + ("met" if ratio["met"] else "NOT met") in text
    rel = vs["relative_half_width"]
    assert (
        f"relative half-width {rel:.3f} here against 0.200 on ml-ref (metrics/eval.json): "
        f"{rel / 0.2:.2f}x" in text
    )
    minutes = "| minutes (mean over the generative seeds) | ingest | baselines | sft | evaluate |"
    assert minutes + " total |" in text
    assert "| rows | 10.0 | 2 | 0.0300 | 2 |" in text
    assert "GPU none\n" in text  # trained where it was prepared: no second machine named


def test_tables_name_the_machine_a_folder_was_prepared_on(tmp_path: Path, runs: Any) -> None:
    gpu = {**MACHINE, "cpus": 16, "gpu": "NVIDIA H100 80GB HBM3"}
    for seed in SEEDS:
        path = seed_file(tmp_path / "seeds", DATASET, "default", seed)
        data = json.loads(path.read_text())
        prepared = {"until": "baselines", "machine": data["record"]["machine"]}
        data["record"] |= {"machine": gpu, "prepared_on": prepared}
        path.write_text(json.dumps(data))
    text = tables(report_of(tmp_path))
    assert (
        "16 CPUs, 2 torch threads, GPU NVIDIA H100 80GB HBM3 (the stages until baselines on "
        "2 CPUs, GPU none)" in text
    )


def test_a_resumed_stage_is_left_out_of_the_minutes_and_the_cpus_are_named(
    tmp_path: Path, runs: Any
) -> None:
    for seed, cpu in zip(SEEDS, ("Xeon", "EPYC", "EPYC"), strict=True):
        path = seed_file(tmp_path / "seeds", DATASET, "default", seed)
        data = json.loads(path.read_text())
        data["record"]["machine"] = {**MACHINE, "cpu": cpu}
        if seed == 1:  # its SASRec went on after epoch 40: its seconds cover the rest only
            data["record"] |= {"resumed": {"baselines": 40}}
            data["record"]["seconds"]["baselines"] = 600.0
        path.write_text(json.dumps(data))
    preset = report_of(tmp_path)["presets"]["default"]
    assert preset["minutes"]["baselines"] == MINUTES["baselines"]  # seeds 0 and 2
    assert preset["minutes_resumed"] == {"baselines, seed 1": 40}
    assert preset["machines"] == ["EPYC", "Xeon"]
    text = tables(report_of(tmp_path))
    assert "left out of the minutes (the stage went on from a resume file" in text
    assert "baselines, seed 1 (after epoch 40)" in text
    assert "GPU none; CPUs (seeds differ) EPYC, Xeon" in text


def test_sft_curves_spread_train_seconds_over_the_steps(tmp_path: Path, runs: Any) -> None:
    workdir = tmp_path / "runs"
    own, rows = run_folder(workdir, "default", 0), run_folder(workdir, "default", 0, "rows")
    assert objective_folder(workdir, "default", 0, "sequence") == own  # reused, not rerun
    assert objective_folder(workdir, "default", 0, "rows") == rows
    curves = report_of(tmp_path)["objectives"]["default"]
    # 600 s over 30 steps: the validation after step 10 at 10 × 20 s = 3.33 min
    assert curves["sequence"]["curve"] == [[3.333, 0.02], [6.667, 0.05], [10.0, 0.04]]
    assert curves["sequence"]["train_minutes"] == 10.0
    assert curves["rows"]["curve"] == [[5.0, 0.01], [10.0, 0.03]]
    plot = tmp_path / "img" / "curves.png"
    plot_curves({"default": curves}, plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_of_ones_own_gets_its_plot_beside_it_not_the_readmes() -> None:
    assert plot_path(None) == PLOT  # the default report: the README's image
    assert plot_path(Path("bench/runs/q678.json")) == Path("bench/runs/q678-valid-ndcg.png")


def test_a_missing_seed_file_or_run_folder_is_a_clear_error(tmp_path: Path, runs: Any) -> None:
    with pytest.raises(InputError, match=r"no seed files of preset quality; run `python -m bench"):
        build_report(tmp_path / "seeds", DATASET, ["quality"], resamples=10)
    workdir = tmp_path / "runs"
    with pytest.raises(InputError, match=r"seed-7: run folder not found; run `python -m bench"):
        load_seed_run(run_folder(workdir, "default", 7))
    with pytest.raises(InputError, match="objective-other-seed-0: run folder not found"):
        report_of(tmp_path, ("other",))
    (folder_paths(run_folder(workdir, "default", 2), DATASET).metrics("eval")).unlink()
    with pytest.raises(InputError, match="the run has no evaluate"):
        load_seed_run(run_folder(workdir, "default", 2))
    (run_folder(workdir, "default", 1) / RUN_RECORD).unlink()
    with pytest.raises(InputError, match="run record not found; the run there did not finish"):
        load_seed_run(run_folder(workdir, "default", 1))


def test_a_seed_file_of_the_same_settings_is_current(tmp_path: Path) -> None:
    """A baselines-only seed needs the baselines' settings alone; a generative one all."""
    folder, path = run_folder(tmp_path, "default", 0), tmp_path / "seed-0.json"
    run = run_overrides("default", 0, [])
    sft, sasrec = (run_overrides("default", 0, [o]) for o in ("sft.epochs=1", "sasrec.lr=0.01"))
    assert not seed_is_current(path, folder, run, generative=False)  # no file
    write_run(folder, 0, BASELINES)
    write_seed_file(folder, path)
    assert seed_is_current(path, folder, run, generative=False)
    assert not seed_is_current(path, folder, run, generative=True)  # SID models wanted now
    assert seed_is_current(path, folder, sft, generative=False)  # SFT's settings: same rows
    assert not seed_is_current(path, folder, sasrec, generative=False)
    write_run(folder, 0)
    write_seed_file(folder, path)
    assert seed_is_current(path, folder, run, generative=True)
    assert seed_is_current(path, folder, run, generative=False)
    assert not seed_is_current(path, folder, sft, generative=True)
    # a generative file whose SID rows are stale is not kept for a baselines-only seed either
    assert not seed_is_current(path, folder, sft, generative=False)


def test_run_all_trains_the_generative_seeds_and_scores_the_others_baselines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 0 runs until evaluate, seeds 1 and 2 until baselines and are scored without SID
    models; current seed files run nothing; seed 1 made generative goes on from sft."""
    ran: list[tuple[int, str, str]] = []
    scored: list[int] = []

    def fake_run(work: Path, overrides: list[str], *, start: Stage, until: Stage) -> StagesRun:
        settings = folder_settings(work, overrides)
        ran.append((settings.project.seed, start, until))
        if until == "evaluate":
            write_eval(settings.paths, settings.project.seed)
        stages = STAGES[STAGES.index(start) : STAGES.index(until) + 1]
        return StagesRun(settings, {}, dict.fromkeys(stages, 60.0))

    def fake_score(settings: Any, *, generative: bool = True) -> tuple[Any, pd.DataFrame]:
        assert not generative
        scored.append(settings.project.seed)
        report, users, _ = eval_outputs(settings.project.seed, BASELINES)
        return report, users

    monkeypatch.setattr(bench.common, "run_stages", fake_run)
    monkeypatch.setattr(tasks.evaluate, "score_models", fake_score)
    args = argparse.Namespace(presets=["default"], seeds=list(SEEDS), generative_seeds=[0])
    vars(args).update(objectives=[], seeds_dir=tmp_path / "seeds", start="ingest", until="evaluate")
    source = Source([], DATASET, tmp_path / "quality.json", tmp_path / "runs")

    def preset() -> Any:
        return build_report(tmp_path / "seeds", DATASET, ["default"], resamples=200)["presets"][
            "default"
        ]

    run_all(args, source, tmp_path / "runs", [])
    assert ran == [
        (0, "ingest", "evaluate"),
        (1, "ingest", "baselines"),
        (2, "ingest", "baselines"),
    ]
    assert scored == [1, 2]
    assert preset()["seeds"] == [0, 1, 2] and preset()["generative_seeds"] == [0]
    run_all(args, source, tmp_path / "runs", [])  # every seed file current: nothing runs
    assert len(ran) == 3 and scored == [1, 2]
    args.generative_seeds = [0, 1]
    run_all(args, source, tmp_path / "runs", [])
    assert ran[3:] == [(1, "sft", "evaluate")] and scored == [1, 2]
    seed_1 = read_seed_file(seed_file(tmp_path / "seeds", DATASET, "default", 1))
    assert seed_1.report["best_generative"] == "grpo"
    assert seed_1.record["seconds"]["baselines"] == 60.0  # kept from the baselines-only run
    assert preset()["generative_seeds"] == [0, 1]


def test_an_unfinished_sasrec_travels_beside_its_seed_file_until_the_seed_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--carry-out copies the run folder's SASRec state beside the seed file; a run of that
    seed in a new folder (another session) starts with it; it goes with the seed file."""
    folder, run = run_folder(tmp_path / "runs", "default", 0), run_overrides("default", 0, [])
    path = seed_file(tmp_path / "seeds", DATASET, "default", 0)
    path.parent.mkdir(parents=True)
    state = folder_settings(folder, run).paths.sasrec_resume
    assert carry_out(folder, path, run) is None  # nothing to carry yet
    state.parent.mkdir(parents=True)
    state.write_bytes(b"after epoch 3")
    assert carry_out(folder, path, run) == f"{state} -> {carried_state(path)}"
    assert carried_state(path).read_bytes() == b"after epoch 3"
    shutil.rmtree(tmp_path / "runs")  # a new session: the run folder is gone
    found: list[bytes] = []

    def fake_run(work: Path, overrides: list[str], *, start: Stage, until: Stage) -> StagesRun:
        settings = folder_settings(work, overrides)
        found.append(settings.paths.sasrec_resume.read_bytes())
        settings.paths.sasrec_resume.unlink()  # the baselines stage finished
        return StagesRun(settings, {}, dict.fromkeys(STAGES[: STAGES.index(until) + 1], 60.0))

    def fake_score(settings: Any, *, generative: bool = True) -> tuple[Any, pd.DataFrame]:
        report, users, _ = eval_outputs(settings.project.seed, BASELINES)
        return report, users

    monkeypatch.setattr(bench.common, "run_stages", fake_run)
    monkeypatch.setattr(tasks.evaluate, "score_models", fake_score)
    args = argparse.Namespace(presets=["default"], seeds=[0], generative_seeds=[])
    vars(args).update(objectives=[], seeds_dir=tmp_path / "seeds", start="ingest", until="evaluate")
    source = Source([], DATASET, tmp_path / "quality.json", tmp_path / "runs")
    run_all(args, source, tmp_path / "runs", [])
    assert found == [b"after epoch 3"]
    assert path.exists() and not carried_state(path).exists()


def test_a_source_names_its_dataset_outputs_and_run_folders() -> None:
    settings = load_settings(REPO / "params.yaml")
    own = source_of(None)
    assert own == source_of(settings.ingest.source)
    assert own.overrides == [] and own.dataset == settings.project.dataset
    assert (own.output, own.workdir) == (
        REPO / "metrics" / "quality.json",
        REPO / "bench" / "runs" / "quality",
    )
    assert source_of("movielens-1m") == Source(
        ["ingest.source=movielens-1m", "project.dataset=movielens-1m"],
        "movielens-1m",
        REPO / "metrics" / "quality-movielens-1m.json",
        REPO / "bench" / "runs" / "quality-movielens-1m",
    )
    with pytest.raises(ConfigError, match="ingest.source"):
        source_of("no-such-source")


def test_a_finished_run_with_the_same_settings_is_reused_and_others_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[str, str]] = []

    def fake_run(work: Path, overrides: list[str], *, start: Stage, until: Stage) -> StagesRun:
        ran.append((overrides[0], start))
        return StagesRun(folder_settings(work, overrides), {}, {start: 1.04})

    monkeypatch.setattr(bench.common, "run_stages", fake_run)
    folder = tmp_path / "run"
    record = ensure_run(folder, ["project.seed=3"], "sft")
    assert record["seconds"] == {"ingest": 1.0} and record["seed"] == 3
    assert json.loads((folder / RUN_RECORD).read_text()) == record
    assert ensure_run(folder, ["project.seed=3"], "sft") == record  # same settings: reused
    further = ensure_run(folder, ["project.seed=3"], "grpo")  # further: on from its next stage
    assert further["until"] == "grpo" and further["seconds"] == {"ingest": 1.0, "grpo": 1.0}
    ensure_run(folder, ["project.seed=4"], "sft")  # other settings: rerun from the start
    assert ran == [
        ("project.seed=3", "ingest"),
        ("project.seed=3", "grpo"),
        ("project.seed=4", "ingest"),
    ]


def test_a_folder_prepared_until_a_stage_is_trained_from_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--until baselines on one machine, --start sft on another: the later run keeps the earlier
    stages' seconds and machine, and refuses a folder not prepared with the same settings."""
    ran: list[tuple[str, str]] = []

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        ran.append((start, until))
        stages: tuple[Stage, ...] = (
            ("ingest", "baselines") if start == "ingest" else ("sft", "evaluate")
        )
        return StagesRun(folder_settings(work, overrides), {}, dict.fromkeys(stages, 2.0))

    monkeypatch.setattr(bench.common, "run_stages", fake_run)
    folder = tmp_path / "run"
    with pytest.raises(InputError, match="--until baselines"):  # nothing prepared
        ensure_run(folder, ["project.seed=3"], "evaluate", start="sft")
    ensure_run(folder, ["project.seed=3"], "baselines")
    prepared = json.loads((folder / RUN_RECORD).read_text())
    prepared["machine"] = {**prepared["machine"], "cpus": 2, "gpu": None}
    (folder / RUN_RECORD).write_text(json.dumps(prepared))
    with pytest.raises(InputError, match="with these settings"):
        ensure_run(folder, ["project.seed=4"], "evaluate", start="sft")
    with pytest.raises(InputError, match="--until grpo"):  # baselines is not grpo
        ensure_run(folder, ["project.seed=3"], "evaluate", start="evaluate")

    def failing_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        raise RuntimeError("out of GPU memory")

    monkeypatch.setattr(bench.common, "run_stages", failing_run)
    with pytest.raises(RuntimeError):
        ensure_run(folder, ["project.seed=3"], "evaluate", start="sft")
    assert json.loads((folder / RUN_RECORD).read_text()) == prepared  # still prepared: retry
    monkeypatch.setattr(bench.common, "run_stages", fake_run)
    record = ensure_run(folder, ["project.seed=3"], "evaluate", start="sft")
    assert ran == [("ingest", "baselines"), ("sft", "evaluate")]
    assert record["until"] == "evaluate"
    assert record["seconds"] == {"ingest": 2.0, "baselines": 2.0, "sft": 2.0, "evaluate": 2.0}
    assert record["prepared_on"] == {"until": "baselines", "machine": prepared["machine"]}
    assert ensure_run(folder, ["project.seed=3"], "evaluate", start="sft") == record  # reused


def test_a_key_at_its_neutral_value_leaves_the_digest_it_had_before_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, seed = tmp_path / "seed-0", ["project.seed=0"]
    neutral = settings_digest(folder, seed)
    assert settings_digest(folder, [*seed, "sasrec.lr_schedule=constant"]) == neutral
    assert settings_digest(folder, [*seed, "sasrec.lr_schedule=cosine"]) != neutral
    monkeypatch.setattr(bench.common, "DIGEST_NEUTRAL", {})  # the key counted like any other
    assert settings_digest(folder, seed) != neutral


def test_the_settings_digest_survives_a_move_of_the_folder(tmp_path: Path) -> None:
    """Paths inside the run folder are recorded relative to it; other settings still count."""
    a, b = tmp_path / "here" / "seed-0", tmp_path / "there" / "seed-0"
    assert settings_digest(a, ["project.seed=0"]) == settings_digest(b, ["project.seed=0"])
    assert settings_digest(a, ["project.seed=0"]) != settings_digest(a, ["project.seed=1"])
