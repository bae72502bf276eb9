"""Validation-driven training: ranking metrics of the model being trained, the best model kept,
early stopping — one ``transformers`` callback for SFT (every N epochs) and GRPO (every N steps).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

from transformers import TrainerCallback

from sidrec.distributed import broadcast_from_main
from sidrec.tracking import metric_key

log = logging.getLogger(__name__)


class ValidationCallback(TrainerCallback):
    """HR/NDCG@K on a fixed validation sample every ``every`` steps or epochs (``unit``) and at
    the end of training, however it ends (before the first step too with ``at_start``); logged to the active
    MLflow run as ``valid/<metric>``. Whenever ``metric`` improves, ``save_best(model)`` is
    called, so the best model survives training; after ``patience`` validations in a row
    without improvement training stops (None: never early).

    The training batch is never used here: rewards or loss on it are optimistic by construction.

    Under ``accelerate launch`` every process ranks the same sample (generation is collective
    when the parameters are sharded, FSDP; on GPUs the others would only wait) and every
    process takes the main process's result, so all decide alike whether to keep the model and
    whether to stop: a process that stopped alone would leave the others waiting forever.
    ``save_best`` is called on every process too (gathering sharded parameters is collective);
    it writes on the main process only.

    ``weights(model)``, when given, is a context that puts other weights into the model for a
    validation and the save that may follow (``models.weight_average.WeightAverage.applied``:
    the moving average of the weights is judged and kept, not the last step's).
    """

    def __init__(
        self,
        *,
        evaluate: Callable[[Any], dict[str, float]],
        save_best: Callable[[Any], None],
        every: int,
        unit: Literal["step", "epoch"] = "step",
        at_start: bool = True,
        patience: int | None = None,
        metric: str = "ndcg@10",
        weights: Callable[[Any], AbstractContextManager[Any]] | None = None,
    ):
        if every < 1 or (patience is not None and patience < 1):
            raise ValueError(f"need every >= 1 and patience >= 1, got {every}, {patience}")
        self.evaluate = evaluate
        self.save_best = save_best
        self.every, self.unit = every, unit
        self.at_start = at_start
        self.patience = patience
        self.metric = metric
        self.weights = weights or (lambda _model: nullcontext())
        self.history: list[dict[str, float]] = []
        self.best: dict[str, float] | None = None
        self.stale = 0
        self.stopped_early = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        if self.at_start:
            self._validate(state, control, model)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        last = state.global_step >= state.max_steps
        if self.unit == "step" and (state.global_step % self.every == 0 or last):
            self._validate(state, control, model)

    def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        last = state.global_step >= state.max_steps
        if self.unit == "epoch" and (round(state.epoch or 0) % self.every == 0 or last):
            self._validate(state, control, model)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        self._validate(state, control, model)  # a no-op when the last step was validated

    def _validate(self, state: Any, control: Any, model: Any) -> None:
        step = int(state.global_step)
        if self.history and self.history[-1]["step"] == step:
            return
        with self.weights(model):
            self._judge(step, state, control, model)

    def _judge(self, step: int, state: Any, control: Any, model: Any) -> None:
        was_training = model.training
        model.eval()
        try:
            metrics = broadcast_from_main(self.evaluate(model))
        finally:
            model.train(was_training)
        record = {"step": float(step), **metrics}
        if self.unit == "epoch":
            record["epoch"] = round(float(state.epoch or 0), 3)
        self.history.append(record)
        _log_mlflow({f"valid/{metric_key(k)}": v for k, v in metrics.items()}, step)
        improved = self.best is None or metrics[self.metric] > self.best[self.metric]
        log.info(
            "%s %s: valid %s %.4f%s",
            self.unit,
            record.get("epoch", step),
            self.metric,
            metrics[self.metric],
            " (best)" * improved,
        )
        if improved:
            self.best, self.stale = record, 0
            self.save_best(model)
            return
        self.stale += 1
        if self.patience is not None and self.stale >= self.patience:
            log.info("no improvement in %d validations: training stops", self.stale)
            self.stopped_early = True
            control.should_training_stop = True


def _log_mlflow(metrics: dict[str, float], step: int) -> None:
    """Into the run the trainer's MLflow integration opened (nothing when there is none)."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.log_metrics(metrics, step=step)
