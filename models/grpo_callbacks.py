"""Sample tables of GRPO rollouts with their rewards (validation during training is
``models/validation.py``, shared with SFT)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from models.rewards import NO_TARGET

if TYPE_CHECKING:
    from models.grpo_trainer import RolloutRewards

log = logging.getLogger(__name__)

SampleSink = Callable[[int, list[dict[str, Any]]], None]
"""Receives ``(step, rows)`` for each sample table."""


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
            "target": (
                self.titles[row["target_index"]] if row["target_index"] != NO_TARGET else "(none)"
            ),
            "rank": batch.ranks[i],
            "completion": self.titles[item] if item >= 0 else "<invalid>",
            **{name: round(float(v), 4) for name, v in rewards},
        }
