"""The validation callback: when it validates, which model it keeps, when it stops training."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from models.validation import ValidationCallback


class Run:
    """A stand-in trainer loop: calls the callback's hooks as transformers' Trainer does."""

    def __init__(self, callback: ValidationCallback, *, steps_per_epoch: int, epochs: int):
        self.cb, self.per_epoch, self.epochs = callback, steps_per_epoch, epochs
        self.state = SimpleNamespace(global_step=0, epoch=0.0, max_steps=steps_per_epoch * epochs)
        self.control = SimpleNamespace(should_training_stop=False)
        self.model = torch.nn.Linear(1, 1)

    def train(self) -> None:
        args, state, control, model = None, self.state, self.control, self.model
        self.cb.on_train_begin(args, state, control, model=model)
        for _ in range(self.epochs):
            for _ in range(self.per_epoch):
                state.global_step += 1
                state.epoch += 1 / self.per_epoch
                self.cb.on_step_end(args, state, control, model=model)
                if control.should_training_stop:
                    break
            self.cb.on_epoch_end(args, state, control, model=model)
            if control.should_training_stop:
                break
        self.cb.on_train_end(args, state, control, model=model)


def _callback(scores, **kwargs):
    seen, kept = [], []

    def evaluate(model):
        assert not model.training  # ranked in eval mode
        seen.append(len(seen))
        return {"ndcg@10": scores[len(seen) - 1]}

    cb = ValidationCallback(evaluate=evaluate, save_best=lambda m: kept.append(len(seen)), **kwargs)
    return cb, seen, kept


def test_epochs_validate_on_schedule_and_keep_the_best():
    cb, _seen, kept = _callback([0.1, 0.3, 0.2, 0.25], every=2, unit="epoch", at_start=False)
    run = Run(cb, steps_per_epoch=3, epochs=7)
    run.train()
    # epochs 2, 4, 6 and the end of training (epoch 7)
    assert [r["epoch"] for r in cb.history] == [2.0, 4.0, 6.0, 7.0]
    assert [r["step"] for r in cb.history] == [6.0, 12.0, 18.0, 21.0]
    assert kept == [1, 2]  # saved after the first and the second validation only
    assert cb.best is not None and cb.best["epoch"] == 4.0
    assert run.model.training  # handed back in training mode
    assert not cb.stopped_early


def test_patience_stops_training_after_validations_without_improvement():
    cb, seen, kept = _callback(
        [0.3, 0.2, 0.1, 0.5, 0.6], every=1, unit="epoch", at_start=False, patience=2
    )
    run = Run(cb, steps_per_epoch=2, epochs=5)
    run.train()
    assert len(seen) == 3 and cb.stopped_early and run.control.should_training_stop
    assert run.state.global_step == 6  # epochs 4 and 5 never ran
    assert cb.best is not None and cb.best["epoch"] == 1.0 and kept == [1]


def test_steps_validate_from_the_start_and_at_the_last_step():
    cb, _seen, kept = _callback([0.2, 0.1, 0.4, 0.3], every=4, unit="step")
    Run(cb, steps_per_epoch=5, epochs=2).train()
    assert [r["step"] for r in cb.history] == [0.0, 4.0, 8.0, 10.0]
    assert "epoch" not in cb.history[0]
    assert cb.best is not None and cb.best["step"] == 8.0 and kept == [1, 3]


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="every >= 1"):
        _callback([], every=0)
    with pytest.raises(ValueError, match="patience >= 1"):
        _callback([], every=1, patience=0)
