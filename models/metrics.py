"""Top-K ranking metrics for next-item recommendation with one held-out target per row.

Every model (popularity, SASRec, the semantic-ID generator) hands over the same thing: a
(rows, k) array of item indices (catalog order), best first, with ``-1`` where it has no
item to offer (e.g. a constrained decoder that found fewer than k valid IDs). Metrics are
computed here and only here, so numbers from different models are comparable.

Accuracy (HR / NDCG, per row or averaged) comes with two beyond-accuracy views of the same
rankings: catalog coverage and the popularity percentile of what is recommended. Confidence
intervals over rows live in ``models.stats``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

DEFAULT_KS: tuple[int, ...] = (1, 5, 10, 20)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and bool(value >= 1)


def _validate_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks or not all(_is_positive_int(k) for k in ks):
        raise ValueError(f"ks must be a non-empty sequence of positive ints, got {ks!r}")
    return tuple(int(k) for k in ks)


def _positive_int(value: int, name: str) -> int:
    if not _is_positive_int(value):
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _first_duplicate_row(topk: np.ndarray) -> int | None:
    """Index of the first row holding the same valid (>= 0) item twice, or None."""
    ordered = np.sort(topk, axis=1)
    repeated = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    rows = np.flatnonzero(repeated.any(axis=1))
    return int(rows[0]) if len(rows) else None


def _validate_topk(topk: np.ndarray, k: int, n_items: int | None = None) -> None:
    """Checks shared by every metric: a non-empty 2-D integer ranking, at least ``k`` columns,
    only ``-1`` or catalog indices (``< n_items`` when the catalog size is known), no item
    twice in a row (it would count as two hits or two recommendations)."""
    if topk.ndim != 2:
        raise ValueError(f"topk must be a 2-D (rows, k) array of item indices, got {topk.shape}")
    if len(topk) == 0:
        raise ValueError("no rows to evaluate: topk is empty")
    if not np.issubdtype(topk.dtype, np.integer):
        raise ValueError(f"topk must hold integer item indices, got {topk.dtype}")
    if topk.shape[1] < k:
        raise ValueError(
            f"topk has {topk.shape[1]} columns but metrics were asked at K={k}; "
            f"recommend at least {k} items per row or lower K"
        )
    if (topk < -1).any():
        row = int(np.flatnonzero((topk < -1).any(axis=1))[0])
        raise ValueError(f"topk holds indices < -1 (row {row}); use -1 for 'no item' only")
    if n_items is not None and (topk >= n_items).any():
        row = int(np.flatnonzero((topk >= n_items).any(axis=1))[0])
        raise ValueError(
            f"topk row {row} holds indices outside the catalog [0, {n_items}): "
            f"{topk[row].tolist()}; pass the size of the catalog the model ranks"
        )
    dup = _first_duplicate_row(topk)
    if dup is not None:
        raise ValueError(
            f"topk row {dup} recommends the same item twice ({topk[dup].tolist()}); "
            "duplicates would count one target as several hits, deduplicate the ranking first"
        )


def _validate_targets(targets: np.ndarray, rows: int) -> None:
    if targets.ndim != 1 or len(targets) != rows:
        raise ValueError(
            f"targets must be a 1-D array with one item index per topk row ({rows}), "
            f"got shape {targets.shape}"
        )
    if not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets must hold integer item indices, got {targets.dtype}")
    if (targets < 0).any():
        row = int(np.flatnonzero(targets < 0)[0])
        raise ValueError(f"targets must be item indices >= 0, row {row} has {targets[row]}")


def per_row_metrics(
    topk: np.ndarray, targets: np.ndarray, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, np.ndarray]:
    """Per-row (per-user) ``hr@K`` and ``ndcg@K`` as float64 arrays of length ``rows``.

    Kept per row so that confidence intervals and paired model comparisons
    (``models.stats``) resample users rather than trusting one average. Binary relevance
    with a single target per row: HR@K is 1 if the target is among the first K items;
    NDCG@K is 1 / log2(rank + 2) for a hit at 0-based ``rank`` < K, else 0 (the ideal DCG
    of one relevant item is 1). ``-1`` entries never hit.
    """
    topk, targets, ks = np.asarray(topk), np.asarray(targets), _validate_ks(ks)
    _validate_topk(topk, max(ks))
    _validate_targets(targets, len(topk))
    hits = (topk == targets[:, None]) & (topk >= 0)
    # A miss gets rank = number of columns, which is >= every K (checked above).
    rank = np.where(hits.any(axis=1), hits.argmax(axis=1), topk.shape[1])
    gain = 1.0 / np.log2(rank + 2.0)
    metrics: dict[str, np.ndarray] = {}
    for k in ks:
        within = rank < k
        metrics[f"hr@{k}"] = within.astype(np.float64)
        metrics[f"ndcg@{k}"] = np.where(within, gain, 0.0)
    return metrics


def rank_metrics(
    topk: np.ndarray, targets: np.ndarray, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, float]:
    """``hr@K`` and ``ndcg@K`` for each K in ``ks``: the row means of ``per_row_metrics``."""
    return {name: float(v.mean()) for name, v in per_row_metrics(topk, targets, ks).items()}


def catalog_coverage(topk: np.ndarray, n_items: int, k: int) -> float:
    """Fraction of the ``n_items`` catalog recommended in at least one row's top-``k``.

    Accuracy alone rewards recommending the same popular items to everyone; coverage shows
    how much of the catalog a model actually surfaces. ``-1`` entries are ignored.
    """
    topk, n_items = np.asarray(topk), _positive_int(n_items, "n_items")
    k = _positive_int(k, "k")
    _validate_topk(topk, k, n_items)
    shown = topk[:, :k]
    return len(np.unique(shown[shown >= 0])) / n_items


def popularity_percentiles(counts: np.ndarray) -> np.ndarray:
    """Each catalog item's popularity percentile: 0 = least, 100 = most interacted with.

    Tied items share the average of their ranks, so an all-equal catalog (one item
    included) sits at 50 rather than at an arbitrary end.
    """
    counts = np.asarray(counts)
    if counts.ndim != 1 or len(counts) == 0:
        raise ValueError(f"counts must be a non-empty 1-D array, one per item, got {counts.shape}")
    if not np.issubdtype(counts.dtype, np.number) or not np.isfinite(counts).all():
        raise ValueError("counts must be finite numbers (training interactions per item)")
    if (counts < 0).any():
        raise ValueError(f"counts must be >= 0, item {int(np.flatnonzero(counts < 0)[0])} is not")
    if len(counts) == 1:
        return np.full(1, 50.0)
    _, inverse, tied = np.unique(counts, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(tied) - tied + (tied - 1) / 2.0  # 0-based, averaged over ties
    return 100.0 * mean_rank[inverse] / (len(counts) - 1)


def popularity_percentile(topk: np.ndarray, counts: np.ndarray, k: int) -> float:
    """Mean popularity percentile (``popularity_percentiles``) of every recommended item.

    Averaged over all (row, position) recommendations in the top-``k``, ``-1`` ignored:
    a high value means the model mostly echoes the head of the catalog. ``counts`` holds
    the training interactions of each catalog item (its length is the catalog size).
    Raises ``ValueError`` when the top-``k`` holds no item at all, since no value (0 would
    read as "only niche items") describes a model that recommended nothing.
    """
    topk, k = np.asarray(topk), _positive_int(k, "k")
    percentiles = popularity_percentiles(counts)
    _validate_topk(topk, k, len(percentiles))
    shown = topk[:, :k]
    shown = shown[shown >= 0]
    if len(shown) == 0:
        raise ValueError(
            f"no item was recommended in any row's top-{k} (all -1): popularity is undefined; "
            "check the model's decoding before reading its popularity bias"
        )
    return float(percentiles[shown].mean())


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
    k = _positive_int(k, "k")
    n, n_items = scores.shape
    scores = scores.detach().float()
    banned = None
    if exclude is not None:
        banned = exclusion_mask(exclude, n, n_items, scores.device)
        scores = scores.masked_fill(banned, float("-inf"))
    idx = torch.topk(scores, min(k, n_items), dim=1).indices
    if banned is not None:
        idx = idx.masked_fill(banned.gather(1, idx), -1)
    out = np.full((n, k), -1, dtype=np.int64)
    out[:, : idx.shape[1]] = idx.cpu().numpy()
    return out


def exclusion_mask(
    exclude: Sequence[Sequence[int]], n: int, n_items: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(n, n_items) bool, True where row r's index list ``exclude[r]`` names the item (catalog
    rows, i.e. positions in the item order, not item ids)."""
    if isinstance(exclude, str) or len(exclude) != n:
        raise ValueError(
            f"exclude must have one index list per score row ({n}), got {len(exclude)}"
        )
    rows = [r for r, items in enumerate(exclude) for _ in items]
    cols = [int(i) for items in exclude for i in items]
    if cols and not (min(cols) >= 0 and max(cols) < n_items):
        bad = next(r for r, items in enumerate(exclude) if any(not 0 <= i < n_items for i in items))
        raise ValueError(
            f"exclude row {bad} holds indices outside the catalog [0, {n_items}) (pass catalog "
            f"rows, not item ids): {list(exclude[bad])}"
        )
    mask = torch.zeros((n, n_items), dtype=torch.bool, device=device)
    mask[
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(cols, dtype=torch.long, device=device),
    ] = True
    return mask
