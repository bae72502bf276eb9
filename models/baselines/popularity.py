"""Most-popular baseline: everyone gets the items with the most training interactions.

Popularity counts every training interaction once. Train rows only carry capped, overlapping
histories (an item appears in up to ``split.max_history`` of them), so counting history
items row by row would weigh items by how long they stay in histories. Instead each user's
training sequence is rebuilt (:func:`models.baselines.train_sequences`: first history +
every target) and its items are counted; for leave-one-out this is exactly the interaction
count of everything before the validation item.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from models.baselines import catalog_index, encode_histories, train_sequences
from models.metrics import topk_from_scores

logger = logging.getLogger(__name__)


class Popularity:
    """Non-personalized ranking by training interaction count (ties: catalog order)."""

    def __init__(self, *, item_ids: Sequence[str]):
        self.item_ids = list(item_ids)
        self.index = catalog_index(self.item_ids)
        self.counts = np.zeros(len(self.item_ids), dtype=np.int64)
        """Training interactions per item (catalog order); zero until :meth:`fit`."""
        self.ranking = np.arange(len(self.item_ids), dtype=np.int64)
        """Item indices, most popular first."""

    def fit(self, train: pd.DataFrame) -> Popularity:
        """Count interactions in the rebuilt training sequences; returns ``self``."""
        sequences = encode_histories(train_sequences(train), self.index, "train sequences")
        flat = np.fromiter((i for seq in sequences for i in seq), dtype=np.int64)
        self.counts = np.bincount(flat, minlength=len(self.item_ids)).astype(np.int64)
        self.ranking = np.argsort(-self.counts, kind="stable").astype(np.int64)
        logger.info(
            "popularity: %d interactions over %d of %d items",
            len(flat),
            int((self.counts > 0).sum()),
            len(self.item_ids),
        )
        return self

    @classmethod
    def from_counts(
        cls, *, item_ids: Sequence[str], counts: Sequence[int] | np.ndarray
    ) -> Popularity:
        """A fitted model from interaction counts (catalog order), e.g. saved with a served model."""
        model = cls(item_ids=item_ids)
        values = np.asarray(counts, dtype=np.int64)
        if values.shape != (len(model.item_ids),) or bool((values < 0).any()):
            raise ValueError(
                f"counts must be {len(model.item_ids)} non-negative integers, one per item"
            )
        model.counts = values
        model.ranking = np.argsort(-values, kind="stable").astype(np.int64)
        return model

    def recommend(
        self, n: int, k: int, *, exclude: Sequence[Sequence[int]] | None = None
    ) -> np.ndarray:
        """(n, k) int64: the top-k item indices for every row (-1 past the catalog).

        ``exclude``: per row, item indices that row may not get (e.g. its history); a row left
        with fewer than k items ends in -1."""
        if n < 0 or k < 1:
            raise ValueError(f"need n >= 0 rows and k >= 1 items, got n={n}, k={k}")
        if exclude is None:
            top = np.full(k, -1, dtype=np.int64)
            top[: min(k, len(self.ranking))] = self.ranking[:k]
            return np.tile(top, (n, 1))
        # scores that reproduce the ranking exactly (counts tie in catalog order)
        order = np.empty(len(self.ranking), dtype=np.float32)
        order[self.ranking] = np.arange(len(self.ranking), 0, -1)
        scores = torch.from_numpy(order)
        chunks = [
            topk_from_scores(scores.expand(len(part), -1), k, exclude=part)
            for part in (exclude[s : s + 1024] for s in range(0, n, 1024))
        ]
        return np.concatenate(chunks) if chunks else np.empty((0, k), dtype=np.int64)
