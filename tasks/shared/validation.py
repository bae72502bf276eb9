"""Validation during training, shared by SFT and GRPO: the model being trained, ranked on the
selection half of the validation users exactly as the evaluate stage ranks."""

from __future__ import annotations

from typing import Any

import pandas as pd

from models.baselines import encode_targets
from models.metrics import rank_metrics
from models.recommender import SidRecommender
from sidrec.config import Settings
from sidrec.protocol import seen_items, validation_half

VALID_KS = (1, 5, 10)


class ValidationSample:
    """HR/NDCG@K of the model being trained on the selection half of the validation users
    (``users`` of them, a fixed random sample; None: all), ranked by the shared recommender
    exactly as the evaluate stage ranks (same beam width, same exclusion of seen items), so the
    checkpoint kept is the one evaluate would prefer. The gate half is never read."""

    def __init__(
        self,
        settings: Settings,
        recommender: SidRecommender,
        train: pd.DataFrame,
        valid: pd.DataFrame,
        *,
        users: int | None,
    ):
        """``settings``: the seed of the sample and evaluate's ``exclude_seen``."""
        rows = validation_half(valid, "selection")
        n = min(users or len(rows), len(rows))
        seed = settings.project.seed
        sample = rows.sample(n=n, random_state=seed) if n < len(rows) else rows
        self.histories = [list(h) for h in sample["history"]]
        self.exclude = None
        if settings.evaluate.exclude_seen:  # over the whole half: a user's earlier rows count
            seen = seen_items(train, rows)  # even where the sample left them out
            self.exclude = [seen[row] for row in sample.index]
        index = recommender.index
        self.targets = encode_targets(list(sample["target"]), index, "valid targets")
        self.recommender = recommender

    def __len__(self) -> int:
        return len(self.targets)

    def __call__(self, model: Any) -> dict[str, float]:
        ranking = self.recommender.with_model(model).rank(
            self.histories, max(VALID_KS), exclude=self.exclude
        )
        return rank_metrics(ranking.items, self.targets, VALID_KS)
