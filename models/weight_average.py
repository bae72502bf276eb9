"""An exponential moving average of the weights while a model trains, for validation to judge
and keep instead of the last step's weights (``sft.ema_decay``).

The average is torch's :class:`~torch.optim.swa_utils.AveragedModel` with its EMA update
(``get_ema_multi_avg_fn``), refreshed after every optimizer step. :meth:`WeightAverage.applied`
puts the averaged weights into the training model for the length of a ``with`` block (a
validation and, when it improves, the save of the kept model) and gives the live weights back
afterwards, so the optimizer never sees the average.

The average is built at ``on_train_begin`` from the model the trainer hands to its callbacks:
that is the model it trains, after any PEFT wrapping, so both hold the same parameters in the
same order. Parameters sharded across processes (FSDP, DeepSpeed ZeRO-3) are not averaged: each process would
hold its shard only, so the run is refused with a message instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import TrainerCallback

from models.validation import ValidationCallback

log = logging.getLogger(__name__)


def decay_for(decay: float, steps: int) -> float:
    """The decay a run of ``steps`` optimizer steps averages with: ``decay``, or less where its
    span (``1 / (1 - decay)`` steps) would exceed half the run, which would leave the average
    mostly the first steps' weights."""
    return max(0.0, min(decay, 1.0 - 2.0 / max(steps, 1)))


class WeightAverage(TrainerCallback):
    """EMA of the trained model's parameters: ``avg = decay * avg + (1 - decay) * weights``
    after every optimizer step (the first step copies). ``decay`` 0.995 averages over roughly
    the last 200 steps; a run shorter than twice that averages over its last half
    (:meth:`decay_for`)."""

    def __init__(self, decay: float, setting: str = "sft.ema_decay"):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"{setting} must lie in (0, 1), got {decay}")
        self.decay = decay
        self.setting = setting
        self.averaged: AveragedModel | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true")
        if fsdp or os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
            raise ValueError(
                f"{self.setting} averages whole parameters, and FSDP / DeepSpeed ZeRO-3 shard "
                f"them across processes: set {self.setting}: null or launch with another config"
            )
        decay = self.decay_for(int(state.max_steps))
        if decay < self.decay:
            log.info(
                "%s %s spans more than half of the %d planned steps: averaging with %.4f",
                self.setting,
                self.decay,
                state.max_steps,
                decay,
            )
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.averaged.requires_grad_(False)

    def decay_for(self, steps: int) -> float:
        return decay_for(self.decay, steps)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        assert self.averaged is not None, "on_train_begin builds the average"
        self.averaged.update_parameters(model)

    @contextmanager
    def applied(self, model: torch.nn.Module) -> Iterator[None]:
        """The averaged weights in ``model`` inside the block, its own weights again after it
        (however the block ends). Before the first step this is the model as it started."""
        assert self.averaged is not None, "on_train_begin builds the average"
        params = list(model.parameters())
        live = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, a in zip(params, self.averaged.module.parameters(), strict=True):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, saved in zip(params, live, strict=True):
                    p.copy_(saved)


def with_average(
    validator: ValidationCallback, decay: float | None, setting: str
) -> list[TrainerCallback]:
    """The trainer's callbacks for ``validator``: itself alone (``decay`` None), or a
    :class:`WeightAverage` ahead of it whose average it judges and keeps (ahead, so the average
    includes a step before a validation at that step's end)."""
    if decay is None:
        return [validator]
    average = WeightAverage(decay, setting)
    validator.weights = average.applied
    return [average, validator]
