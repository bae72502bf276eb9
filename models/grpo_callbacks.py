"""Trainer callbacks for GRPO: validation ranking metrics during training, best model kept."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)


class ValidationCallback(TrainerCallback):
    """HR/NDCG@K on a fixed validation sample before the first step, every ``every`` steps and
    after the last; logged to the active MLflow run as ``valid/<metric>``; whenever
    ``metric`` improves, ``save_best(model)`` is called, so the best model survives training.

    The training batch is never used here: rewards on it are optimistic by construction.
    """

    def __init__(
        self,
        *,
        evaluate: Callable[[Any], dict[str, float]],
        save_best: Callable[[Any], None],
        every: int,
        metric: str = "ndcg@10",
    ):
        self.evaluate = evaluate
        self.save_best = save_best
        self.every = every
        self.metric = metric
        self.history: list[dict[str, float]] = []
        self.best: dict[str, float] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        self._validate(state.global_step, model)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        due = state.global_step % self.every == 0 or state.global_step >= state.max_steps
        if due and (not self.history or self.history[-1]["step"] != state.global_step):
            self._validate(state.global_step, model)

    def _validate(self, step: int, model: Any) -> None:
        was_training = model.training
        model.eval()
        try:
            metrics = self.evaluate(model)
        finally:
            model.train(was_training)
        record = {"step": float(step), **metrics}
        self.history.append(record)
        _log_mlflow({f"valid/{k.replace('@', '_at_')}": v for k, v in metrics.items()}, step)
        improved = self.best is None or metrics[self.metric] > self.best[self.metric]
        log.info(
            "step %d: valid %s %.4f%s",
            step,
            self.metric,
            metrics[self.metric],
            " (best)" * improved,
        )
        if improved:
            self.best = record
            self.save_best(model)


def _log_mlflow(metrics: dict[str, float], step: int) -> None:
    """Into the run the trainer's MLflow integration opened (nothing when there is none)."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.log_metrics(metrics, step=step)
