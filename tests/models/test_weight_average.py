"""The moving average of the weights: its values, the swap in and out of the model, and what
the validation callback judges and keeps with it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from models.validation import ValidationCallback
from models.weight_average import WeightAverage

NONE = SimpleNamespace()
LONG = SimpleNamespace(max_steps=1000)  # a run long enough for every decay used here


def _set(model: torch.nn.Linear, value: float) -> None:
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(-value)


def test_the_average_follows_every_step_with_the_decay():
    model, average = torch.nn.Linear(2, 1), WeightAverage(0.5)
    _set(model, 1.0)
    average.on_train_begin(NONE, LONG, NONE, model=model)
    for value in (2.0, 4.0, 8.0):  # the first step copies, then avg = 0.5 avg + 0.5 w
        _set(model, value)
        average.on_step_end(NONE, NONE, NONE, model=model)
    with average.applied(model):
        assert torch.allclose(
            model.weight, torch.full((1, 2), 5.5)
        )  # (2 + 4) / 2, then (3 + 8) / 2
        assert torch.allclose(model.bias, torch.full((1,), -5.5))
    # the live weights come back, and the optimizer's parameters are the same tensors
    assert torch.allclose(model.weight, torch.full((1, 2), 8.0))


def test_the_live_weights_come_back_when_the_block_fails():
    model, average = torch.nn.Linear(2, 1), WeightAverage(0.9)
    _set(model, 1.0)
    average.on_train_begin(NONE, LONG, NONE, model=model)
    average.on_step_end(NONE, NONE, NONE, model=model)
    _set(model, 3.0)
    weight = model.weight
    with pytest.raises(RuntimeError, match="boom"), average.applied(model):
        assert torch.allclose(model.weight, torch.ones(1, 2))
        raise RuntimeError("boom")
    assert model.weight is weight and torch.allclose(model.weight, torch.full((1, 2), 3.0))


def test_a_short_run_averages_over_its_last_half_at_most():
    average = WeightAverage(0.995)  # spans ~200 steps
    assert average.decay_for(1204) == 0.995  # the default SFT run: unchanged
    assert average.decay_for(100) == pytest.approx(0.98)  # ~50 steps
    assert average.decay_for(2) == 0.0 and average.decay_for(0) == 0.0  # the last weights
    model = torch.nn.Linear(1, 1)
    average.on_train_begin(NONE, SimpleNamespace(max_steps=2), NONE, model=model)
    _set(model, 3.0)
    average.on_step_end(NONE, NONE, NONE, model=model)
    _set(model, 5.0)
    average.on_step_end(NONE, NONE, NONE, model=model)
    with average.applied(model):
        assert model.weight.item() == 5.0


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5])
def test_a_decay_outside_zero_and_one_is_refused(decay):
    with pytest.raises(ValueError, match=r"sft.ema_decay must lie in \(0, 1\)"):
        WeightAverage(decay)


@pytest.mark.parametrize(
    "env", [("ACCELERATE_USE_FSDP", "true"), ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")]
)
def test_sharded_parameters_are_refused_by_name(monkeypatch, env):
    monkeypatch.setenv(*env)
    with pytest.raises(ValueError, match="sft.ema_decay .* FSDP / DeepSpeed ZeRO-3"):
        WeightAverage(0.99).on_train_begin(NONE, LONG, NONE, model=torch.nn.Linear(1, 1))


def test_validation_judges_and_keeps_the_average_and_training_goes_on_with_its_weights():
    model, average = torch.nn.Linear(1, 1), WeightAverage(0.5)
    judged, kept = [], []

    def evaluate(m):
        judged.append(m.weight.item())
        return {"ndcg@10": m.weight.item()}

    validator = ValidationCallback(
        evaluate=evaluate,
        save_best=lambda m: kept.append(m.weight.item()),
        every=1,
        unit="step",
        at_start=False,
        weights=average.applied,
    )
    state = SimpleNamespace(global_step=0, epoch=0.0, max_steps=4)  # decay 0.5 stays
    control = SimpleNamespace(should_training_stop=False)
    _set(model, 0.0)
    for callback in (average, validator):  # the order sft.py registers them in
        callback.on_train_begin(NONE, state, control, model=model)
    for value in (2.0, 4.0):
        _set(model, value)
        state.global_step += 1
        for callback in (average, validator):
            callback.on_step_end(NONE, state, control, model=model)
        assert model.weight.item() == value  # the live weights train on
    assert judged == [2.0, 3.0] and kept == [2.0, 3.0]  # the averages, not 2.0 and 4.0
