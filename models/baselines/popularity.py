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

from models.baselines import catalog_index, encode_histories, train_sequences

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

    def recommend(self, n: int, k: int) -> np.ndarray:
        """(n, k) int64: the same top-k item indices for every row (-1 past the catalog)."""
        if n < 0 or k < 1:
            raise ValueError(f"need n >= 0 rows and k >= 1 items, got n={n}, k={k}")
        top = np.full(k, -1, dtype=np.int64)
        top[: min(k, len(self.ranking))] = self.ranking[:k]
        return np.tile(top, (n, 1))
