"""`sidrec pipeline` on the embedded default (MovieLens-100k from the RecBole wheel), as `make run` does:
every stage, ingest to register, then `sidrec register` again and `sidrec recommend`.

The training budgets are cut (`REDUCED`: fewer epochs and steps, the same code paths and data),
so the run takes a few minutes instead of `make run`'s fourteen; how good the models get is the
benchmarks' business (`python -m bench.protocol`), not this test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from sidrec.paths import SPLITS

REDUCED = (
    "sasrec.max_epochs=8",  # best epoch ~19 at full budget; 8 epochs already beat popularity
    "sft.epochs=0.2",  # a fifth of the packed rows; the validation that keeps the model still runs
    "sft.eval_users=64",  # SFT's checkpoint selection on a fixed sample of the selection half
    "grpo.max_steps=2",  # validations at steps 0 and 2
    "grpo.eval_every=2",
    "grpo.eval_users=64",  # on a fixed sample of the 469 selection users, as SFT's
    "grpo.log_samples_every=2",
    # a model trained for a fifth of an epoch trails the baselines, which the gate's check
    # against the best baseline refuses (tests/tasks/test_register.py); this test follows the
    # champion path
    "register.gate_best_baseline=false",
)
"""Training budgets for this test (``--set`` overrides of the repository's params.yaml)."""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_pipeline_on_movielens_100k(project):
    env = {**os.environ, "PREFECT_HOME": str(project / ".prefect")}
    env.pop("PREFECT_API_URL", None)  # the ephemeral local API, as on a fresh machine
    env.pop("MLFLOW_TRACKING_URI", None)  # the embedded default, sqlite:///mlflow.db
    reduced = [arg for key_value in REDUCED for arg in ("--set", key_value)]
    proc = subprocess.run(
        [sys.executable, "-m", "sidrec", "pipeline", *reduced],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=1000,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ingest = json.loads((project / "metrics" / "ingest.json").read_text())
    assert (ingest["users"], ingest["items"], ingest["interactions"]) == (943, 1682, 100_000)
    validation = json.loads((project / "metrics" / "validation.json").read_text())
    assert validation["success"] and validation["users_below_min_interactions"] == 0
    split = json.loads((project / "metrics" / "split.json").read_text())
    assert {s: split[s]["rows"] for s in SPLITS} == {"train": 97_171, "valid": 943, "test": 943}
    assert "100,000" in proc.stdout and "1,682" in proc.stdout
    sid_map = json.loads((project / "data" / "sids" / "ml-100k" / "sid_map.json").read_text())
    assert len(sid_map) == 1682
    assert len({len(v) for v in sid_map.values()}) == 1
    assert len({tuple(v) for v in sid_map.values()}) == 1682
    sids = json.loads((project / "metrics" / "sids.json").read_text())
    assert sids["collision_rate_after"] == 0.0 and sids["items"] == 1682
    assert sids["level_usage"][0]["usage"] >= 0.9
    assert {"collision_rate_before", "largest_collision_group", "reconstruction_error"} <= set(sids)
    report = json.loads((project / "metrics" / "eval.json").read_text())
    assert list(report["test"]) == ["popularity", "sasrec", "ease", "blend", "sft", "grpo"]
    assert report["best_baseline"] in ("popularity", "sasrec", "ease", "blend")
    assert report["protocol"]["baselines"]["left_out"] == {}
    for row in report["test"].values():
        assert {f"{m}@{k}" for m in ("hr", "ndcg") for k in (1, 5, 10, 20)} <= set(row)
    assert report["test"]["sft"]["invalid_rate"] == 0.0
    assert report["test"]["grpo"]["invalid_rate"] == 0.0
    grpo = json.loads((project / "metrics" / "grpo.json").read_text())
    assert grpo["distinct_items_per_group"] == 1.0 and grpo["steps"] > 0
    # GRPO selects its checkpoint as evaluate ranks (tests/models/test_grpo_trainer.py shows
    # that a GRPO step moves the model towards rewarded completions)
    # the 943 validation users: 469 select checkpoints, the other 474 judge (sidrec/protocol.py)
    assert grpo["valid_num_beams"] == 20 and grpo["valid_users"] == 64
    assert report["protocol"]["exclude_seen"] is True and report["protocol"]["num_beams"] == 20
    assert report["protocol"]["users"] == {"valid": 474, "test": 943}
    for model, ci in report["intervals"]["test"].items():
        assert ci["ndcg@10"]["low"] <= report["test"][model]["ndcg@10"] <= ci["ndcg@10"]["high"]
    assert list(report["paired"]["test"]) == [
        "sft - sasrec",
        "grpo - sft",
        "best generative - sasrec",
        "grpo - sasrec",
        "sft - best baseline",
        "grpo - best baseline",
        "best generative - best baseline",
    ]
    assert report["test"]["sasrec"]["ndcg@10"] > report["test"]["popularity"]["ndcg@10"]
    assert (project / "artifacts" / "sft" / "ml-100k" / "model" / "config.json").exists()
    (saved,) = list((project / "runs").glob("*-retrain/params.yaml"))
    assert yaml.safe_load(saved.read_text())["project"]["dataset"] == "ml-100k"

    # the registry: version 1 of sidrec-ml-100k is the champion, and it serves recommendations
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    assert str(client.get_model_version_by_alias("sidrec-ml-100k", "champion").version) == "1"
    registered = json.loads((project / "metrics" / "register.json").read_text())
    # register.candidate auto: the SID model evaluate picked on the gate users
    assert registered["promoted"] and registered["candidate"] == report["best_generative"]
    assert registered["gate_metric"] == "valid.ndcg@10"
    # registering the same model again re-scores the champion: identical, so nothing moves
    again = subprocess.run(
        [sys.executable, "-m", "sidrec", "register"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((project / "metrics" / "register.json").read_text())
    assert (second["version"], second["promoted"]) == ("2", False)
    assert str(client.get_model_version_by_alias("sidrec-ml-100k", "champion").version) == "1"
    rec = subprocess.run(
        [sys.executable, "-m", "sidrec", "recommend", "--user", "1"],
        cwd=project,
        env={**env, "COLUMNS": "250"},  # one table row per line
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rec.returncode == 0, rec.stderr[-3000:]
    items = pd.read_parquet(project / "data" / "validated" / "ml-100k" / "items.parquet")
    title_of = dict(zip(items["item_id"], items["title"], strict=True))
    rows = [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in rec.stdout.splitlines()
        if line.startswith("│")
    ]
    assert [r[0] for r in rows] == [str(rank) for rank in range(1, 11)], rec.stdout
    assert all(title_of[item_id] == title for _, item_id, title in rows)
