"""Top-K ranking metrics for next-item recommendation with one held-out target per row.

Every model (popularity, SASRec, the semantic-ID generator) hands over the same thing: a
(rows, k) array of item indices (catalog order), best first, with ``-1`` where it has no
item to offer (e.g. a constrained decoder that found fewer than k valid IDs). Metrics are
computed here and only here, so numbers from different models are comparable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

DEFAULT_KS: tuple[int, ...] = (1, 5, 10, 20)


def _validate_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks or not all(isinstance(k, int | np.integer) and k >= 1 for k in ks):
        raise ValueError(f"ks must be a non-empty sequence of positive ints, got {ks!r}")
    return tuple(int(k) for k in ks)


def _first_duplicate_row(topk: np.ndarray) -> int | None:
    """Index of the first row holding the same valid (>= 0) item twice, or None."""
    ordered = np.sort(topk, axis=1)
    repeated = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    rows = np.flatnonzero(repeated.any(axis=1))
    return int(rows[0]) if len(rows) else None


def _validate_inputs(topk: np.ndarray, targets: np.ndarray, ks: tuple[int, ...]) -> None:
    if topk.ndim != 2:
        raise ValueError(f"topk must be a 2-D (rows, k) array of item indices, got {topk.shape}")
    if targets.ndim != 1 or len(targets) != len(topk):
        raise ValueError(
            f"targets must be a 1-D array with one item index per topk row ({len(topk)}), "
            f"got shape {targets.shape}"
        )
    if len(topk) == 0:
        raise ValueError("no rows to evaluate: topk and targets are empty")
    if not (np.issubdtype(topk.dtype, np.integer) and np.issubdtype(targets.dtype, np.integer)):
        raise ValueError(
            f"topk and targets must hold integer item indices, got {topk.dtype} and {targets.dtype}"
        )
    if topk.shape[1] < max(ks):
        raise ValueError(
            f"topk has {topk.shape[1]} columns but metrics were asked at K={max(ks)}; "
            f"recommend at least {max(ks)} items per row or lower ks"
        )
    if (targets < 0).any():
        row = int(np.flatnonzero(targets < 0)[0])
        raise ValueError(f"targets must be item indices >= 0, row {row} has {targets[row]}")
    if (topk < -1).any():
        row = int(np.flatnonzero((topk < -1).any(axis=1))[0])
        raise ValueError(f"topk holds indices < -1 (row {row}); use -1 for 'no item' only")
    dup = _first_duplicate_row(topk)
    if dup is not None:
        raise ValueError(
            f"topk row {dup} recommends the same item twice ({topk[dup].tolist()}); "
            "duplicates would count one target as several hits, deduplicate the ranking first"
        )


def rank_metrics(
    topk: np.ndarray, targets: np.ndarray, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, float]:
    """``hr@K`` and ``ndcg@K`` for each K in ``ks``, averaged over rows.

    Binary relevance with a single target per row: HR@K is 1 if the target is among the
    first K items; NDCG@K is 1 / log2(rank + 2) for a hit at 0-based ``rank`` < K, else 0
    (the ideal DCG of one relevant item is 1). ``-1`` entries never hit.
    """
    topk, targets, ks = np.asarray(topk), np.asarray(targets), _validate_ks(ks)
    _validate_inputs(topk, targets, ks)
    hits = (topk == targets[:, None]) & (topk >= 0)
    found = hits.any(axis=1)
    rank = np.where(found, hits.argmax(axis=1), np.iinfo(np.int64).max)
    gain = np.where(found, 1.0 / np.log2(np.where(found, rank, 0) + 2.0), 0.0)
    metrics: dict[str, float] = {}
    for k in ks:
        within = rank < k
        metrics[f"hr@{k}"] = float(within.mean())
        metrics[f"ndcg@{k}"] = float(np.where(within, gain, 0.0).mean())
    return metrics


def topk_from_scores(
    scores: torch.Tensor, k: int, exclude: Sequence[Sequence[int]] | None = None
) -> np.ndarray:
    """(n, k) int64 indices of the k best-scored items per row (full-catalog ranking).

    ``exclude`` (one index list per row) removes items from that row's ranking, e.g. the
    items of its history; nothing is excluded by default. Rows left with fewer than k
    items are padded with ``-1``.
    """
    if scores.ndim != 2:
        raise ValueError(f"scores must be a 2-D (rows, n_items) tensor, got {tuple(scores.shape)}")
    if not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    n, n_items = scores.shape
    scores = scores.detach().float()
    banned = None
    if exclude is not None:
        banned = _exclusion_mask(exclude, n, n_items, scores.device)
        scores = scores.masked_fill(banned, float("-inf"))
    idx = torch.topk(scores, min(int(k), n_items), dim=1).indices
    if banned is not None:
        idx = idx.masked_fill(banned.gather(1, idx), -1)
    out = np.full((n, int(k)), -1, dtype=np.int64)
    out[:, : idx.shape[1]] = idx.cpu().numpy()
    return out


def _exclusion_mask(
    exclude: Sequence[Sequence[int]], n: int, n_items: int, device: torch.device
) -> torch.Tensor:
    if len(exclude) != n:
        raise ValueError(
            f"exclude must have one index list per score row ({n}), got {len(exclude)}"
        )
    rows = [r for r, items in enumerate(exclude) for _ in items]
    cols = [int(i) for items in exclude for i in items]
    if cols and not (min(cols) >= 0 and max(cols) < n_items):
        bad = next(r for r, items in enumerate(exclude) if any(not 0 <= i < n_items for i in items))
        raise ValueError(
            f"exclude row {bad} holds indices outside the catalog [0, {n_items}): "
            f"{list(exclude[bad])}"
        )
    mask = torch.zeros((n, n_items), dtype=torch.bool, device=device)
    mask[
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(cols, dtype=torch.long, device=device),
    ] = True
    return mask
