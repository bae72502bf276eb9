"""Collaborative item factors: a truncated SVD of the binary user × item interaction matrix.

``X ≈ U·S·Vᵀ`` (``scipy.sparse.linalg.svds``, ARPACK, seeded start vector). An item's factor is
its row of ``V·√S`` — the symmetric split of the singular values between users and items
(``X ≈ (U√S)(V√S)ᵀ``): stronger components weigh more than in plain ``V`` (whose every
component has unit length, noise included), and the first component, which on implicit
feedback mostly measures popularity, weighs less than in ``V·S`` (whose Gram matrix is the
co-occurrence matrix itself). Rows are then L2-normalized, as the text embeddings are.

Because ``V·√S = Xᵀ·(U·S^-1/2)``, the factor of any item is its users' column of ``X`` times the
*projection* ``U·S^-1/2``: the fitted items get exactly their SVD factors, and items coded later
(incremental SIDs) are folded into the same space by the saved :class:`CollaborativeBasis`
instead of a new, differently rotated SVD. Items without interactions get a zero row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from scipy import sparse
from scipy.sparse.linalg import svds


class CollaborativeBasis(NamedTuple):
    """What maps an item's users to its factor (saved with the quantizer)."""

    user_ids: list[str]
    """The users of the fitted matrix, in row order (users seen later are ignored)."""
    projection: np.ndarray
    """(users, dim) float32 ``U·S^-1/2``: an item's factor is its user indicator times this."""

    def state(self) -> dict[str, Any]:
        return {"user_ids": list(self.user_ids), "projection": torch.from_numpy(self.projection)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CollaborativeBasis:
        projection = np.asarray(state["projection"].numpy(), dtype=np.float32)
        return cls(user_ids=[str(u) for u in state["user_ids"]], projection=projection)


class ItemFactors(NamedTuple):
    factors: np.ndarray
    """(items, dim) float32, unit rows in catalog order; zero rows for items without interactions."""
    without_interactions: np.ndarray
    """(items,) bool: no interaction by a user of the basis (a zero row)."""
    basis: CollaborativeBasis


def interaction_matrix(
    users: Sequence[str], items: Sequence[str], *, user_ids: Sequence[str], item_ids: Sequence[str]
) -> sparse.csr_matrix:
    """Binary (len(user_ids), len(item_ids)) matrix of the (user, item) pairs; repeated pairs
    count once, pairs of users outside ``user_ids`` are dropped."""
    if len(users) != len(items):
        raise ValueError(f"users and items must pair up, got {len(users)} and {len(items)}")
    rows = pd.Index(user_ids).get_indexer(pd.Index(users))
    cols = pd.Index(item_ids).get_indexer(pd.Index(items))
    if (cols < 0).any():
        unknown = sorted({str(i) for i, c in zip(items, cols, strict=True) if c < 0})
        raise ValueError(f"{len(unknown)} item(s) outside item_ids, e.g. {unknown[:5]}")
    keep = rows >= 0
    matrix = sparse.csr_matrix(
        (np.ones(int(keep.sum())), (rows[keep], cols[keep])),
        shape=(len(user_ids), len(item_ids)),
    )
    matrix.data[:] = 1.0  # duplicates were summed
    return matrix


def fit_item_factors(
    users: Sequence[str], items: Sequence[str], *, item_ids: Sequence[str], dim: int, seed: int
) -> ItemFactors:
    """Factors of ``item_ids`` from the (user, item) interaction pairs (a truncated SVD of rank
    ``dim``, which must be smaller than both the number of users and of items)."""
    user_ids = list(dict.fromkeys(str(u) for u in users))
    if not 1 <= dim < min(len(user_ids), len(item_ids)):
        raise ValueError(
            f"dim must be between 1 and min(users, items) - 1 = "
            f"{min(len(user_ids), len(item_ids)) - 1}, got {dim}"
        )
    matrix = interaction_matrix(users, items, user_ids=user_ids, item_ids=item_ids)
    u, s, _ = svds(matrix, k=dim, rng=np.random.default_rng(seed))
    order = np.argsort(-s, kind="stable")
    u, s = u[:, order], s[order]
    # a deterministic sign per component: the item side's (Xᵀu) largest entry is positive
    v = matrix.T @ u
    u *= np.where(v[np.abs(v).argmax(0), np.arange(dim)] < 0, -1.0, 1.0)
    # rank-deficient matrices give (near-)zero singular values: those components are dropped
    scale = np.divide(1.0, np.sqrt(s), out=np.zeros_like(s), where=s > 1e-8 * max(s.max(), 1.0))
    basis = CollaborativeBasis(user_ids=user_ids, projection=(u * scale).astype(np.float32))
    return _factors(matrix, basis)


def fold_in(
    users: Sequence[str],
    items: Sequence[str],
    *,
    item_ids: Sequence[str],
    basis: CollaborativeBasis,
) -> ItemFactors:
    """Factors of ``item_ids`` in the space of a saved basis (users it does not know are ignored)."""
    matrix = interaction_matrix(users, items, user_ids=basis.user_ids, item_ids=item_ids)
    return _factors(matrix, basis)


def _factors(matrix: sparse.csr_matrix, basis: CollaborativeBasis) -> ItemFactors:
    factors = np.asarray(matrix.T @ basis.projection.astype(np.float64))
    norms = np.linalg.norm(factors, axis=1, keepdims=True)
    unit = np.divide(factors, norms, out=np.zeros_like(factors), where=norms > 1e-12)
    without = np.asarray(matrix.getnnz(axis=0) == 0)
    return ItemFactors(unit.astype(np.float32), without, basis)
