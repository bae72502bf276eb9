"""bench/quality.py on run folders written by the test (known numbers; nothing trains): means
and sds over seeds, the best generative / SASRec ratio and its paired interval, the JSON, the
tables, the SFT curves and plot, reuse of finished runs, and the errors for missing runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import bench.common
from bench.common import (
    RUN_RECORD,
    StagesRun,
    ensure_run,
    folder_paths,
    folder_settings,
    settings_digest,
)
from bench.quality import (
    BEST,
    PLOT,
    build_report,
    objective_folder,
    plot_curves,
    plot_path,
    run_folder,
    tables,
    tracked_metrics,
)
from models.stats import seed_noise
from sidrec.errors import InputError
from sidrec.io import atomic_write_json

MODELS = ("popularity", "sasrec", "sft", "grpo")
SEEDS = (0, 1, 2)
USERS = [f"u{i}" for i in range(60)]
BEST_PER_SEED = {0: "grpo", 1: "grpo", 2: "sft"}
"""What evaluate picked on valid, per seed (deliberately not the better one on test at seed 2)."""
SECONDS = {"ingest": 6.0, "sft": 120.0, "evaluate": 30.0}
MACHINE = {"cpus": 2, "torch_threads": 2, "gpu": None, "platform": "test", "torch": "x"}


def user_scores(seed: int, users: list[str] = USERS) -> dict[str, dict[str, np.ndarray]]:
    """Per model the per-user test hr@10 (0/1) and ndcg@10 (≤ hr) of one seed."""
    rng = np.random.default_rng(seed)
    rates = {"popularity": 0.1, "sasrec": 0.3, "sft": 0.2, "grpo": 0.25}
    scores = {}
    for model in MODELS:
        hr = (rng.random(len(users)) < rates[model]).astype(float)
        scores[model] = {"hr@10": hr, "ndcg@10": hr * rng.uniform(0.3, 1.0, len(users))}
    return scores


def write_run(folder: Path, seed: int, users: list[str] = USERS) -> dict[str, dict[str, Any]]:
    """A finished run as ``ensure_run`` + the evaluate stage leave it; returns its scores."""
    paths = folder_paths(folder, "ml-test")
    scores = user_scores(seed, users)
    frames = [
        pd.DataFrame({"split": "test", "model": m, "user_id": users, **scores[m]}) for m in MODELS
    ]
    frames.append(pd.DataFrame({"split": "valid", "model": "sft", "user_id": ["v"]}))
    paths.metrics_dir.mkdir(parents=True)
    pd.concat(frames).to_parquet(paths.eval_users)
    report = {
        "test": {m: {k: float(v.mean()) for k, v in scores[m].items()} for m in MODELS},
        "best_generative": BEST_PER_SEED[seed],
        "test_rows": len(users),
    }
    atomic_write_json(paths.metrics("eval"), report)
    record = {"dataset": "ml-test", "seed": seed, "until": "evaluate", "seconds": SECONDS}
    atomic_write_json(folder / RUN_RECORD, {**record, "machine": MACHINE})
    return scores


def write_sft(folder: Path, objective: str, ndcgs: list[float], *, record: bool = False) -> None:
    """metrics/sft.json: one validation per epoch of 10 steps, 600 s of training in all."""
    paths = folder_paths(folder, "ml-test")
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
        atomic_write_json(folder / RUN_RECORD, {"dataset": "ml-test", "seed": 0, "until": "sft"})


@pytest.fixture
def runs(tmp_path: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """Three seeds of preset default under ``tmp_path``; seed 0 trained the sequence objective,
    a separate run the rows objective."""
    scores = {s: write_run(run_folder(tmp_path, "default", s), s) for s in SEEDS}
    write_sft(run_folder(tmp_path, "default", 0), "sequence", [0.02, 0.05, 0.04])
    rows = run_folder(tmp_path, "default", 0, "rows")
    write_sft(rows, "rows", [0.01, 0.03], record=True)
    return scores


def report_of(workdir: Path, objectives: tuple[str, ...] = ("sequence", "rows")) -> Any:
    return build_report(workdir, ["default"], list(SEEDS), list(objectives), resamples=300)


def test_means_and_sds_over_seeds(tmp_path: Path, runs: Any) -> None:
    preset = report_of(tmp_path)["presets"]["default"]
    for model in MODELS:
        for metric in ("hr@10", "ndcg@10"):
            per_seed = [float(runs[s][model][metric].mean()) for s in SEEDS]
            row = preset["models"][model][metric]
            assert row["per_seed"] == pytest.approx(per_seed)
            assert row["mean"] == pytest.approx(np.mean(per_seed), abs=1e-6)
            assert row["sd"] == pytest.approx(statistics.stdev(per_seed), abs=1e-6)
    # best generative: per seed the model evaluate picked on valid, never the better on test
    assert preset["best_generative"] == ["grpo", "grpo", "sft"]
    best = [float(runs[s][BEST_PER_SEED[s]]["ndcg@10"].mean()) for s in SEEDS]
    assert preset["models"][BEST]["ndcg@10"]["mean"] == pytest.approx(np.mean(best), abs=1e-6)
    assert preset["test_users"] == len(USERS)
    assert preset["seeds"] == list(SEEDS)
    assert preset["machine"] == MACHINE
    assert preset["minutes"] == {"ingest": 0.1, "sft": 2.0, "evaluate": 0.5, "total": 2.6}


def test_ratio_is_that_of_the_seed_averaged_means_and_lies_in_its_interval(
    tmp_path: Path, runs: Any
) -> None:
    ratio = report_of(tmp_path)["presets"]["default"]["best_generative_vs_sasrec"]
    best = np.mean([runs[s][BEST_PER_SEED[s]]["ndcg@10"].mean() for s in SEEDS])
    sasrec = np.mean([runs[s]["sasrec"]["ndcg@10"].mean() for s in SEEDS])
    assert ratio["ratio"] == pytest.approx(best / sasrec, abs=1e-4)
    assert ratio["low"] < ratio["ratio"] < ratio["high"]
    assert ratio["metric"] == "ndcg@10" and ratio["confidence"] == 0.95
    assert ratio["target"] == 1.0 and ratio["met"] is bool(best / sasrec >= 1.0)
    assert ratio["resamples"] == 300


def test_grpo_minus_sft_is_the_paired_difference_of_the_seed_averaged_users(
    tmp_path: Path, runs: Any
) -> None:
    g = report_of(tmp_path)["presets"]["default"]["grpo_minus_sft"]
    grpo = np.mean([runs[s]["grpo"]["ndcg@10"] for s in SEEDS], axis=0)
    sft = np.mean([runs[s]["sft"]["ndcg@10"] for s in SEEDS], axis=0)
    assert g["diff"] == pytest.approx(float((grpo - sft).mean()), abs=1e-5)
    assert g["ratio"] == pytest.approx(float(grpo.mean() / sft.mean()), abs=1e-4)
    assert g["low"] < g["diff"] < g["high"]
    assert "GRPO - SFT test NDCG@10: " + f"{g['diff']:+.4f}" in tables(report_of(tmp_path))


def test_both_comparisons_say_what_endless_seeds_would_leave(tmp_path: Path, runs: Any) -> None:
    preset = report_of(tmp_path)["presets"]["default"]
    best = np.stack([runs[s][BEST_PER_SEED[s]]["ndcg@10"] for s in SEEDS], axis=1)
    sasrec = np.stack([runs[s]["sasrec"]["ndcg@10"] for s in SEEDS], axis=1)
    grpo = np.stack([runs[s]["grpo"]["ndcg@10"] for s in SEEDS], axis=1)
    sft = np.stack([runs[s]["sft"]["ndcg@10"] for s in SEEDS], axis=1)
    ratio, g = preset["best_generative_vs_sasrec"], preset["grpo_minus_sft"]
    for comparison, diffs, reference in [(ratio, best - sasrec, sasrec), (g, grpo - sft, sft)]:
        half = seed_noise(diffs).half_width_endless
        assert comparison["half_width_endless_seeds"] == pytest.approx(half, abs=1e-5)
        assert comparison["relative"] == pytest.approx(half / reference.mean(), abs=1e-4)
    text = tables(report_of(tmp_path))
    assert f"would keep ± {ratio['half_width_endless_seeds']:.4f} (± " in text
    assert text.count("which no seed removes") == 2
    one_seed = build_report(tmp_path, ["default"], [0], [], resamples=300)
    assert "half_width_endless_seeds" not in one_seed["presets"]["default"]["grpo_minus_sft"]
    assert "which no seed removes" not in tables(one_seed)


def test_without_grpo_there_is_no_grpo_minus_sft(tmp_path: Path) -> None:
    for s in SEEDS:
        folder = run_folder(tmp_path, "default", s)
        write_run(folder, s)
        paths = folder_paths(folder, "ml-test")
        report = json.loads(paths.metrics("eval").read_text())
        report["test"].pop("grpo")
        report["best_generative"] = "sft"
        atomic_write_json(paths.metrics("eval"), report)
    preset = report_of(tmp_path, objectives=())["presets"]["default"]
    assert preset["grpo_minus_sft"] is None


def test_the_json_holds_every_section_and_round_trips(tmp_path: Path, runs: Any) -> None:
    report = report_of(tmp_path)
    atomic_write_json(tmp_path / "quality.json", report)
    assert json.loads((tmp_path / "quality.json").read_text()) == report
    assert report["dataset"] == "ml-test"
    assert set(report["presets"]["default"]) == {
        "seeds",
        "runs",
        "test_users",
        "best_generative",
        "models",
        "best_generative_vs_sasrec",
        "grpo_minus_sft",
        "minutes",
        "machine",
        "prepared_on",
    }
    assert list(report["presets"]["default"]["models"]) == [*MODELS, BEST]
    assert set(report["objectives"]["default"]) == {"sequence", "rows"}
    metrics = tracked_metrics(report)
    assert metrics["default.best_generative_over_sasrec"] == pytest.approx(
        report["presets"]["default"]["best_generative_vs_sasrec"]["ratio"]
    )
    assert metrics["default.grpo_minus_sft"] == pytest.approx(
        report["presets"]["default"]["grpo_minus_sft"]["diff"]
    )
    assert not any("@" in key for key in metrics)


def test_tables_show_mean_sd_ratio_target_and_minutes(tmp_path: Path, runs: Any) -> None:
    report = report_of(tmp_path)
    text = tables(report)
    sasrec = report["presets"]["default"]["models"]["sasrec"]["ndcg@10"]
    assert f"{sasrec['mean']:.4f} ± {sasrec['sd']:.4f}" in text
    assert f"| {BEST} (grpo, grpo, sft) |" in text
    ratio = report["presets"]["default"]["best_generative_vs_sasrec"]
    assert f"{ratio['ratio']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}]" in text
    assert "target >= 1.00x: " + ("met" if ratio["met"] else "NOT met") in text
    assert "| minutes | ingest | sft | evaluate | total |" in text
    assert "| rows | 10.0 | 2 | 0.0300 | 2 |" in text
    assert "GPU none\n" in text  # trained where it was prepared: no second machine named


def test_tables_name_the_machine_a_folder_was_prepared_on(tmp_path: Path, runs: Any) -> None:
    gpu = {**MACHINE, "cpus": 16, "gpu": "NVIDIA H100 80GB HBM3"}
    for seed in SEEDS:
        path = run_folder(tmp_path, "default", seed) / RUN_RECORD
        record = json.loads(path.read_text())
        prepared = {"until": "baselines", "machine": record["machine"]}
        path.write_text(json.dumps({**record, "machine": gpu, "prepared_on": prepared}))
    text = tables(report_of(tmp_path))
    assert (
        "16 CPUs, 2 torch threads, GPU NVIDIA H100 80GB HBM3 (the stages until baselines on "
        "2 CPUs, GPU none)" in text
    )


def test_sft_curves_spread_train_seconds_over_the_steps(tmp_path: Path, runs: Any) -> None:
    own, rows = run_folder(tmp_path, "default", 0), run_folder(tmp_path, "default", 0, "rows")
    assert objective_folder(tmp_path, "default", 0, "sequence") == own  # reused, not rerun
    assert objective_folder(tmp_path, "default", 0, "rows") == rows
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


def test_a_missing_or_unfinished_run_folder_is_a_clear_error(tmp_path: Path, runs: Any) -> None:
    with pytest.raises(InputError, match=r"seed-7: run folder not found; run `python -m bench"):
        build_report(tmp_path, ["default"], [0, 7], [], resamples=10)
    with pytest.raises(InputError, match="run folder not found"):
        build_report(tmp_path, ["quality"], [0], [], resamples=10)
    with pytest.raises(InputError, match="objective-other-seed-0: run folder not found"):
        report_of(tmp_path, ("other",))
    (run_folder(tmp_path, "default", 1) / RUN_RECORD).unlink()
    with pytest.raises(InputError, match="run record not found; the run there did not finish"):
        report_of(tmp_path, ())


def test_seeds_scored_on_different_users_are_refused(tmp_path: Path) -> None:
    write_run(run_folder(tmp_path, "default", 0), 0)
    write_run(run_folder(tmp_path, "default", 1), 1, users=[*USERS[:-1], "someone else"])
    with pytest.raises(InputError, match="test users differ"):
        build_report(tmp_path, ["default"], [0, 1], [], resamples=10)


def test_a_finished_run_with_the_same_settings_is_reused_and_others_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[list[str]] = []

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        ran.append(list(overrides))
        return StagesRun(folder_settings(work, overrides), {}, {"ingest": 1.04})

    monkeypatch.setattr(bench.common, "run_stages", fake_run)
    folder = tmp_path / "run"
    record = ensure_run(folder, ["project.seed=3"], "sft")
    assert record["seconds"] == {"ingest": 1.0} and record["seed"] == 3
    assert json.loads((folder / RUN_RECORD).read_text()) == record
    assert ensure_run(folder, ["project.seed=3"], "sft") == record  # same settings: reused
    assert ensure_run(folder, ["project.seed=3"], "grpo")["until"] == "grpo"  # further: rerun
    ensure_run(folder, ["project.seed=4"], "sft")  # other settings: rerun
    assert ran == [["project.seed=3"]] * 2 + [["project.seed=4"]]


def test_a_folder_prepared_until_a_stage_is_trained_from_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--until baselines on one machine, --start sft on another: the later run keeps the earlier
    stages' seconds and machine, and refuses a folder not prepared with the same settings."""
    ran: list[tuple[str, str]] = []

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        ran.append((start, until))
        stages = ("ingest", "baselines") if start == "ingest" else ("sft", "evaluate")
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


def test_the_settings_digest_survives_a_move_of_the_folder(tmp_path: Path) -> None:
    """Paths inside the run folder are recorded relative to it; other settings still count."""
    a, b = tmp_path / "here" / "seed-0", tmp_path / "there" / "seed-0"
    assert settings_digest(a, ["project.seed=0"]) == settings_digest(b, ["project.seed=0"])
    assert settings_digest(a, ["project.seed=0"]) != settings_digest(a, ["project.seed=1"])
