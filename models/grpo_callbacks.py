"""Trainer callbacks for GRPO: validation ranking metrics during training (best model kept), and
sample tables of rollouts with their rewards."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from sidrec.tracking import metric_key

if TYPE_CHECKING:
    from models.grpo_trainer import RolloutRewards

log = logging.getLogger(__name__)

SampleSink = Callable[[int, list[dict[str, Any]]], None]
"""Receives ``(step, rows)`` for each sample table."""


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
        _log_mlflow({f"valid/{metric_key(k)}": v for k, v in metrics.items()}, step)
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


class SampleTables:
    """Every ``every`` steps: a table of the first ``groups`` groups' prompts (as their recent
    titles), the completions as item titles, their rank and rewards — to the active MLflow run
    and to ``sink``. Called by the trainer with each scored batch (its ``on_rewards``)."""

    def __init__(
        self,
        *,
        every: int,
        groups: int,
        num_generations: int,
        titles: list[str],
        sink: SampleSink | None = None,
    ):
        """``titles``: one per catalog row (the trainer's item indices)."""
        self.every, self.rows, self.g = every, groups, num_generations
        self.titles = titles
        self.sink = sink
        self.tables = 0

    def __call__(self, batch: RolloutRewards) -> None:
        if batch.step % self.every:
            return
        rows = [self._row(batch, i) for i in range(min(len(batch.items), self.rows * self.g))]
        self.tables += 1
        import mlflow
        import pandas as pd

        if mlflow.active_run() is not None:
            artifact = f"grpo_samples/step_{batch.step:06d}.json"
            mlflow.log_table(data=pd.DataFrame(rows), artifact_file=artifact)
        if self.sink is not None:
            self.sink(batch.step, rows)

    def _row(self, batch: RolloutRewards, i: int) -> dict[str, Any]:
        row = batch.inputs[i]
        item = batch.items[i]
        rewards = zip(batch.names, batch.rewards[i].tolist(), strict=True)
        return {
            "step": batch.step,
            "group": i // self.g,
            "recent history": " | ".join(self.titles[h] for h in row["history_index"][-3:]),
            "target": self.titles[row["target_index"]],
            "rank": batch.ranks[i],
            "completion": self.titles[item] if item >= 0 else "<invalid>",
            **{name: round(float(v), 4) for name, v in rewards},
        }
