"""sft and evaluate on a small synthetic catalog with a learnable pattern."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from models.lm import load_model_dir
from models.sid import read_sid_map
from sidrec.errors import InputError
from tasks.evaluate import evaluate
from tasks.sft import sft


@pytest.mark.slow
def test_sft_trains_a_loadable_model_with_sid_tokens(trained, sft_result, synthetic_project):
    from models.lm import build_tiny

    n_items, n_users = synthetic_project.n_items, synthetic_project.n_users
    m = sft_result.metrics  # the session's SFT run, whose model `trained` holds
    # one sequence window per user (6 train items < sft.window) + sid2title + title2sid pairs
    assert m["train_examples"] == n_users + 2 * n_items
    assert m["objective"] == "sequence" and m["valid_history"]
    assert np.isfinite(m["eval_loss_last_step"]) and m["steps"] > 0
    model, tokenizer = load_model_dir(trained.paths.sft_model)
    sid_map = read_sid_map(trained.paths.sid_map)
    for codes in sid_map.values():
        assert all(
            tokenizer.convert_tokens_to_ids(t) != tokenizer.unk_token_id
            for t in (f"<a_{codes[0]}>", f"<b_{codes[1]}>")
        )
    fresh = build_tiny(
        tokenizer,
        hidden_size=32,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate_size=64,
        max_length=128,
        seed=42,
    )
    weights = model.get_input_embeddings().weight
    assert weights.shape == fresh.get_input_embeddings().weight.shape
    assert not torch.allclose(
        weights, fresh.get_input_embeddings().weight
    )  # training moved the weights
    metrics = json.loads(trained.paths.metrics("sft").read_text())
    assert (metrics["model"], metrics["project_preset"]) == ("tiny", "default")


@pytest.mark.slow
def test_evaluate_reports_every_model_on_full_catalog(trained, synthetic_project):
    n_users = synthetic_project.n_users
    result = evaluate(trained)
    report = json.loads(trained.paths.metrics("eval").read_text())
    assert report == json.loads(json.dumps(result.metrics))
    for split_name in ("valid", "test"):
        assert set(report[split_name]) == {"popularity", "sasrec", "ease", "blend", "sft"}
        for row in report[split_name].values():
            assert {f"{m}@{k}" for m in ("hr", "ndcg") for k in (1, 5, 10)} <= set(row)
            assert all(0.0 <= row[f"ndcg@{k}"] <= row[f"hr@{k}"] <= 1.0 for k in (1, 5, 10))
        assert report[split_name]["sft"]["invalid_rate"] == 0.0
        for model, row in report[split_name].items():
            ci = report["intervals"][split_name][model]["ndcg@10"]
            assert ci["low"] <= row["ndcg@10"] <= ci["high"]
            assert 0 < row["coverage@10"] <= 1 and 0 <= row["popularity_percentile@10"] <= 100
    assert set(report["paired"]["test"]) == {
        "sft - sasrec",
        "best generative - sasrec",
        "sft - best baseline",
        "best generative - best baseline",
    }
    assert report["best_generative"] == "sft" and report["test_rows"] == n_users
    fingerprints = report["protocol"]["fingerprints"]
    assert set(fingerprints) == {"split", "sid_map", "sasrec", "ease", "sft_model"}
    users = pd.read_parquet(trained.paths.eval_users)
    test_sft = users[(users["split"] == "test") & (users["model"] == "sft")]
    assert test_sft["ndcg@10"].mean() == pytest.approx(report["test"]["sft"]["ndcg@10"], abs=1e-6)


def test_evaluate_without_k_10_picks_the_generative_model_by_its_largest_k(
    trained, synthetic_project
):
    # (register's gate metric needs K=10, so the gate is off)
    settings = synthetic_project.settings(
        Path.cwd(), evaluate={"ks": [1, 5]}, register={"enabled": False}
    )
    report = evaluate(settings).metrics
    assert report["best_generative"] == "sft" and "ndcg@10" not in report["test"]["sft"]
    users = pd.read_parquet(settings.paths.eval_users)
    sft_test = users[(users["split"] == "test") & (users["model"] == "sft")]
    assert "ndcg@10" not in users.columns
    assert report["test"]["sft"]["ndcg@5"] == round(float(sft_test["ndcg@5"].mean()), 6)


@pytest.mark.slow
def test_sft_learns_the_pattern_popularity_cannot(trained, synthetic_project):
    """Item i is followed by i+1: a working SFT + constrained decoding finds the next item far
    more often than the most popular unseen items do (seeded; the margin is large)."""
    n_users = synthetic_project.n_users
    report = evaluate(trained).metrics
    rows = report["test"]
    assert rows["sft"]["hr@10"] >= 2 * rows["popularity"]["hr@10"], rows
    protocol = report["protocol"]
    assert protocol["exclude_seen"] is True and protocol["num_beams"] == 10
    assert protocol["users"]["test"] == n_users and 0 < protocol["users"]["valid"] < n_users


@pytest.mark.slow
def test_the_gate_rescores_the_champion_on_todays_users(trained, synthetic_project):
    """A worse challenger on the same data is never promoted; a champion whose stored number
    came from easier data loses to a challenger that is better on today's data."""
    import mlflow

    from sidrec.registry import CHAMPION, TAG_GATE_VALUE, client
    from tasks.register import register

    name = "sidrec-gate-rescoring"
    # the champion comparison alone: on this catalog EASE and the blend rank the next item as
    # well as SFT or better, which register.gate_best_baseline would refuse
    # (tests/tasks/test_register.py tests that check)
    settings = synthetic_project.settings(
        trained.paths.data_dir.parent,
        register={"model_name": name, "gate_best_baseline": False},
    )
    trained_model = settings.paths.sft_model.parent / "trained"
    shutil.copytree(settings.paths.sft_model, trained_model)
    evaluate(settings)
    assert register(settings).metrics["promoted"]  # v1: the trained model, first champion

    # a random model of the same tokenizer: worse on the gate users → not promoted
    model, _ = load_model_dir(trained_model)
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(settings.paths.sft_model)
    evaluate(settings)
    worse = register(settings).metrics
    assert not worse["promoted"] and worse["diff_high"] < 0, worse
    registry = client()
    assert str(registry.get_registered_model(name).aliases[CHAMPION]) == "1"

    # make the random model champion and inflate its stored number (as if registered on
    # easier data); the trained challenger must win on today's users all the same
    registry.set_registered_model_alias(name, CHAMPION, worse["version"])
    registry.set_model_version_tag(name, worse["version"], TAG_GATE_VALUE, "0.99")
    shutil.rmtree(settings.paths.sft_model)
    shutil.copytree(trained_model, settings.paths.sft_model)
    evaluate(settings)
    better = register(settings).metrics
    assert better["promoted"] and better["diff_low"] > 0, better
    assert better["champion_value"] < better["candidate_value"] < 0.99
    assert (
        str(mlflow.MlflowClient().get_registered_model(name).aliases[CHAMPION]) == better["version"]
    )


@pytest.mark.slow
def test_short_context_truncates_prompts_without_crashing(prepared):
    short = prepared.model_copy(
        update={
            "model": prepared.model.model_copy(update={"max_length": 20}),
            # prompts are cut before training; 5 items x (2 SID tokens + EOS) + BOS fit 20 tokens
            "sft": prepared.sft.model_copy(update={"epochs": 1, "window": 5}),
        }
    )
    result = sft(short)
    assert result.metrics["truncated_prompts"] > 0


def test_sid_map_that_does_not_match_the_catalog_fails_before_training(prepared):
    sid_map = read_sid_map(prepared.paths.sid_map)
    sid_map.pop("i3")
    prepared.paths.sid_map.write_text(json.dumps(sid_map))
    with pytest.raises(InputError, match="SID map does not match the catalog: 1 catalog item"):
        sft(prepared)
    assert not prepared.paths.sft_model.exists()


def test_evaluate_needs_a_model_folder(prepared):
    with pytest.raises(InputError, match="model folder not found"):
        evaluate(prepared)
    assert not prepared.paths.metrics("eval").exists()


@pytest.mark.slow
def test_evaluate_needs_a_complete_model_folder(trained):
    for weights in trained.paths.sft_model.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(InputError, match=r"model folder is incomplete: missing model weights"):
        evaluate(trained)


@pytest.mark.slow
def test_evaluate_rejects_a_sid_map_the_tokenizer_lacks(trained):
    sid_map = read_sid_map(trained.paths.sid_map)
    sid_map["i0"] = [7, 99]  # <b_99> was never added to the tokenizer
    trained.paths.sid_map.write_text(json.dumps(sid_map))
    with pytest.raises(InputError, match="does not match the model's tokenizer"):
        evaluate(trained)
    assert not trained.paths.metrics("eval").exists()


@pytest.mark.slow
def test_failed_sft_keeps_the_previous_model(trained, monkeypatch):
    before = {p.name: p.read_bytes() for p in trained.paths.sft_model.iterdir()}

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", boom)
    # one epoch: the run fails when it saves its first best model
    once = trained.model_copy(update={"sft": trained.sft.model_copy(update={"epochs": 1})})
    with pytest.raises(RuntimeError, match="disk full"):
        sft(once)
    assert {p.name: p.read_bytes() for p in trained.paths.sft_model.iterdir()} == before
    assert not [p for p in trained.paths.sft_dir.iterdir() if p.name.startswith(".model.")]
    shutil.rmtree(trained.paths.sft_dir)


@pytest.mark.slow
def test_smollm2_preset_with_lora_trains_saves_and_evaluates(prepared, synthetic_project):
    """The pretrained SmolLM2-135M from its wheel, LoRA on, a few steps; the merged folder evaluates."""
    settings = synthetic_project.settings(
        prepared.paths.data_dir.parent,
        model={"preset": "smollm2-135m", "lora": {"enabled": True, "r": 4, "alpha": 8}},
        sft={"epochs": 0.1, "batch_size": 8, "eval_rows": 8, "eval_users": 4},
        evaluate={"max_users": 4},
    )
    result = sft(settings)
    assert result.metrics["model"] == "smollm2-135m" and result.metrics["steps"] >= 1
    model, tokenizer = load_model_dir(settings.paths.sft_model)
    assert type(model).__name__ == "LlamaForCausalLM"  # LoRA merged: a plain model folder
    assert tokenizer.convert_tokens_to_ids("<b_7>") >= 49152  # added after SmolLM2's own vocabulary
    report = evaluate(settings).metrics
    assert report["test"]["sft"]["invalid_rate"] == 0.0 and report["test_rows"] == 4


@pytest.mark.slow
def test_the_moving_average_of_the_weights_is_the_model_kept(prepared, monkeypatch):
    from models import weight_average

    seen: list[tuple[weight_average.WeightAverage, torch.nn.Module]] = []
    original = weight_average.WeightAverage.on_train_begin

    def record(self, args, state, control, model=None, **kwargs):
        seen.append((self, model))
        return original(self, args, state, control, model=model, **kwargs)

    monkeypatch.setattr(weight_average.WeightAverage, "on_train_begin", record)
    # one epoch: one validation, at the end, so the average after the last step is the model kept
    settings = prepared.model_copy(
        update={"sft": prepared.sft.model_copy(update={"epochs": 1, "ema_decay": 0.9})}
    )
    result = sft(settings)
    assert result.metrics["ema_decay"] == 0.9 and len(seen) == 1
    steps = result.metrics["steps"]  # a run this short averages with less than its setting
    assert result.metrics["ema_decay_applied"] == pytest.approx(min(0.9, 1 - 2 / steps))
    average, trained = seen[0]
    kept, _ = load_model_dir(settings.paths.sft_model)
    averaged = dict(average.averaged.module.named_parameters())
    last = dict(trained.named_parameters())  # the live weights after the last step
    for name, param in kept.named_parameters():
        torch.testing.assert_close(param, averaged[name])
    assert any(not torch.allclose(p, last[n]) for n, p in kept.named_parameters())


@pytest.mark.slow
def test_gradient_checkpointing_reaches_the_model_and_changes_no_weight(prepared, monkeypatch):
    """`model.gradient_checkpointing` (off by default; TRL's own default is on) reaches the
    model that trains, and turning it on recomputes activations without changing what is learnt."""
    from models.sft_trainer import SidSFTTrainer

    seen: list[bool] = []
    original = SidSFTTrainer.training_step

    def record(self, model, inputs, *args, **kwargs):
        seen.append(model.is_gradient_checkpointing)
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(SidSFTTrainer, "training_step", record)
    weights: dict[bool, dict[str, torch.Tensor]] = {}
    for on in (False, True):
        seen.clear()
        model_cfg = prepared.model.model_copy(update={"gradient_checkpointing": on})
        sft_cfg = prepared.sft.model_copy(update={"epochs": 1})
        sft(prepared.model_copy(update={"model": model_cfg, "sft": sft_cfg}))
        assert seen and set(seen) == {on}
        kept, _ = load_model_dir(prepared.paths.sft_model)
        weights[on] = {name: p.detach().clone() for name, p in kept.named_parameters()}
    for name, param in weights[False].items():
        torch.testing.assert_close(weights[True][name], param, rtol=1e-5, atol=1e-6)


def test_evaluate_intervals_resample_users_not_rows():
    # A sliding-window split scores each user several times: 30 users, 20 rows each, a user's
    # rows all hits (sft) or all misses. The interval must be that of 30 draws, not 600.
    from models.stats import bootstrap_interval, paired_bootstrap_interval
    from tasks.evaluate import _uncertainty

    rng = np.random.default_rng(0)
    user_ids = np.repeat([f"u{i}" for i in range(30)], 20)
    sft_hits = np.repeat((rng.random(30) < 0.5).astype(float), 20)
    frames = [
        pd.DataFrame({"split": "test", "model": m, "user_id": user_ids, "hr@10": v})
        for m, v in (("sasrec", np.zeros(600)), ("sft", sft_hits))
    ]
    report = _uncertainty(pd.concat(frames, ignore_index=True), "sft", 1000, 0)
    shown = report["intervals"]["test"]["sft"]["hr@10"]
    low, high = shown["low"], shown["high"]
    grouped = bootstrap_interval(sft_hits, groups=user_ids, seed=0)
    assert (low, high) == pytest.approx((grouped.low, grouped.high), abs=1e-6)
    rows = bootstrap_interval(sft_hits, seed=0)
    assert high - low > 3 * (rows.high - rows.low)
    diff = report["paired"]["test"]["sft - sasrec"]["hr@10"]
    expected = paired_bootstrap_interval(sft_hits, np.zeros(600), groups=user_ids, seed=0)
    assert (diff["low"], diff["high"]) == pytest.approx((expected.low, expected.high), abs=1e-6)
