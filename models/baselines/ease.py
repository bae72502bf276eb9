"""EASE (Steck, 2019): a linear item-to-item model in closed form, read with recency weights.

EASE learns an item × item matrix ``B`` (zero diagonal) that rebuilds each user's row of the
interaction matrix ``X`` from the user's other items: ``B = I - P / diag(P)`` with
``P = (XᵀX + λI)⁻¹``. It sees the whole catalog's co-occurrences at once, which a sequence
model with a short history and a small embedding only learns in part.

Here ``X`` is each user's rebuilt training sequence (:func:`models.baselines.train_sequences`,
every item once), and a history is scored with its items weighted by recency: the newest 1,
the one before ``recency``, then ``recency²`` … (``recency: 1`` reads the history as a set, as
plain EASE does). On MovieLens-style next-item splits the recent items say most about the
next one.

The inverse is dense: memory and time grow with the catalog squared and cubed, so
:data:`MAX_ITEMS` bounds it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from models.baselines import catalog_index, encode_histories, train_sequences

logger = logging.getLogger(__name__)

MAX_ITEMS = 30_000
"""The largest catalog EASE fits (a dense float64 inverse of 30,000² is ~7 GB)."""


class EASE:
    """The closed-form item-to-item model; :meth:`fit` it, then :meth:`scores` histories."""

    def __init__(self, *, item_ids: Sequence[str], l2: float = 300.0, recency: float = 0.9):
        if l2 <= 0:
            raise ValueError(f"EASE's l2 must be > 0, got {l2}")
        if not 0 < recency <= 1:
            raise ValueError(f"EASE's recency must be in (0, 1], got {recency}")
        if len(item_ids) > MAX_ITEMS:
            raise ValueError(
                f"EASE inverts a dense {len(item_ids)} × {len(item_ids)} matrix; catalogs above "
                f"{MAX_ITEMS} items are not supported (set its reward weight to 0)"
            )
        self.item_ids = [str(i) for i in item_ids]
        self.index = catalog_index(self.item_ids)
        self.l2, self.recency = float(l2), float(recency)
        self.weights = np.zeros((len(self.item_ids), len(self.item_ids)), dtype=np.float32)
        """``B``: row i holds how much having item i adds to every item's score (zero diagonal)."""

    def fit(self, train: pd.DataFrame) -> EASE:
        """Fit ``B`` on the rebuilt training sequences; returns ``self``."""
        return self.fit_gram(self.gram(train))

    def gram(self, train: pd.DataFrame) -> np.ndarray:
        """(items, items) float64 ``XᵀX`` of the rebuilt training sequences (``X``: one row per
        sequence, 1 where it holds the item): what :meth:`fit_gram` inverts, computed once
        where several ``l2`` are tried. ``X`` is sparse; its counts are exact integers."""
        from scipy import sparse

        sequences = encode_histories(train_sequences(train), self.index, "train sequences")
        rows = [np.unique(np.asarray(items, dtype=np.int64)) for items in sequences]
        x = sparse.csr_matrix(
            (
                np.ones(sum(len(r) for r in rows)),
                np.concatenate([np.zeros(0, dtype=np.int64), *rows]),
                np.cumsum([0, *(len(r) for r in rows)]),
            ),
            shape=(len(rows), len(self.item_ids)),
        )
        logger.info("EASE: %d users, %d items", len(rows), len(self.item_ids))
        return np.asarray((x.T @ x).toarray(), dtype=np.float64)

    def fit_gram(self, gram: np.ndarray) -> EASE:
        """Fit ``B`` from ``XᵀX`` (:meth:`gram`, left unchanged); returns ``self``."""
        n = len(self.item_ids)
        if gram.shape != (n, n):
            raise ValueError(f"gram must be {n} × {n} (the catalog), got {gram.shape}")
        penalized = np.array(gram, dtype=np.float64)
        penalized[np.diag_indices(n)] += self.l2
        inverse = np.linalg.inv(penalized)
        weights = -inverse / np.diag(inverse)
        np.fill_diagonal(weights, 0.0)
        self.weights = weights.astype(np.float32)
        logger.info("EASE: fitted %d items, l2 %g", n, self.l2)
        return self

    def inputs(self, histories: Sequence[Sequence[Any]]) -> np.ndarray:
        """(n, items) float32: each history's items at their recency weight (newest 1; an item
        seen twice keeps its newest weight)."""
        return self.encoded_inputs(encode_histories(histories, self.index, "histories"))

    def encoded_inputs(self, encoded: Sequence[Sequence[int]]) -> np.ndarray:
        """:meth:`inputs` of histories already given as catalog rows (``item_ids`` order)."""
        out = np.zeros((len(encoded), len(self.item_ids)), dtype=np.float32)
        for row, history in enumerate(encoded):
            if not history:
                continue
            decay = self.recency ** np.arange(len(history) - 1, -1, -1, dtype=np.float64)
            np.maximum.at(out[row], np.asarray(history), decay.astype(np.float32))
        return out

    def scores(self, histories: Sequence[Sequence[Any]]) -> np.ndarray:
        """(n, items) float32: every catalog item's score after each history."""
        return self.inputs(histories) @ self.weights


def blend(sasrec: torch.Tensor, ease: torch.Tensor, alpha: float) -> torch.Tensor:
    """(n, items) SASRec's scores with EASE's blended in: ``sasrec + α · sd · z(ease)``, with
    ``z`` each row standardized (mean 0, sd 1; a constant row 0) and ``sd`` the row's sd of
    ``sasrec``. It ranks as ``z(sasrec) + α · z(ease)`` (the blend ``python -m bench.blend``
    scores) and keeps SASRec's own scale, so a softmax temperature means what it meant for SASRec."""
    return sasrec + alpha * sasrec.std(-1, keepdim=True) * _standardized(ease)


def _standardized(values: torch.Tensor) -> torch.Tensor:
    centred = values - values.mean(-1, keepdim=True)
    sd = centred.std(-1, keepdim=True)
    return torch.where(sd > 0, centred / sd.clamp_min(1e-12), torch.zeros_like(centred))
