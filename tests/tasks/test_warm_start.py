"""sft.warm_start: champion — retraining continues from the registered champion's model."""

from __future__ import annotations

import json
import uuid

import pytest
import torch

from models.lm import load_model_dir
from sidrec.registry import champion_label, champion_start
from tasks.evaluate import evaluate
from tasks.register import register
from tasks.sft import sft


def test_without_a_champion_sft_starts_fresh(project, tmp_path, tiny_project):
    settings = tiny_project.settings(
        project, register={"model_name": f"warm-{uuid.uuid4().hex[:8]}"}
    )
    assert champion_start(settings, tmp_path / "dl") is None
    assert champion_label(settings) == ""


def test_the_champions_model_folder_is_the_starting_point(project, tmp_path, tiny_project):
    name = f"warm-{uuid.uuid4().hex[:8]}"
    settings = tiny_project.settings(project, register={"model_name": name})
    tiny_project.write(settings)
    tiny_project.evaluate(settings)
    register(settings)
    assert champion_label(settings) == f"{name}@champion (v1)"

    folder = champion_start(settings, tmp_path / "dl")
    assert folder is not None and (folder / "config.json").exists()
    start, tokenizer = load_model_dir(folder)
    trained, _ = load_model_dir(settings.paths.sft_model)
    for (n, a), (_, b) in zip(start.named_parameters(), trained.named_parameters(), strict=True):
        assert torch.equal(a, b), n  # the very weights that were registered
    assert tokenizer.convert_tokens_to_ids("<b_3>") != tokenizer.unk_token_id


@pytest.mark.slow
def test_sft_continues_from_the_champion(trained, synthetic_project):
    name = f"warm-{uuid.uuid4().hex[:8]}"
    root = trained.paths.data_dir.parent
    # the champion is what this test needs: whether a model trained for seconds trails the
    # baselines (register.gate_best_baseline) is not its business
    settings = synthetic_project.settings(
        root, register={"model_name": name, "gate_best_baseline": False}
    )
    evaluate(settings)
    assert register(settings).metrics["promoted"]  # the SFT model `trained` holds
    champion_score = json.loads(settings.paths.metrics("sft").read_text())["valid_best"]
    # one epoch is enough to see where each run starts
    warm = synthetic_project.settings(
        root, register={"model_name": name}, sft={"warm_start": "champion", "epochs": 1}
    )
    result = sft(warm)
    assert result.metrics["warm_start"] == f"{name}@champion (v1)"
    # validated before its first step: the champion's weights score what they scored when kept
    start = result.metrics["valid_history"][0]
    assert start["epoch"] == 0.0 and start["ndcg@10"] == champion_score["ndcg@10"]
    fresh = synthetic_project.settings(root, register={"model_name": name}, sft={"epochs": 1})
    cold = sft(fresh).metrics
    assert cold["warm_start"] is None  # warm_start none: a fresh model, validated after training
    assert [r["epoch"] for r in cold["valid_history"]] == [1.0]
