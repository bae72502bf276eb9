"""Ranking with EASE and the SASRec + EASE blend, and choosing their settings on validation rows.

A *scorer* maps a batch of histories (catalog rows, oldest first) to a (rows, items) score
matrix; :func:`rank` turns it into top-k lists batch by batch, so a catalog of 10^4 items and
10^4 users never holds a users × items matrix at once. The ``baselines`` stage picks EASE's
L2 (:func:`choose_l2`) and then the blend's weight α (:func:`choose_alpha`) by NDCG@10 on the
validation selection rows; evaluate ranks with the same scorers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from models.baselines.ease import EASE, blend
from models.baselines.sasrec import SASRec, _pad_left
from models.metrics import per_row_metrics, topk_from_scores

Scorer = Callable[[Sequence[Sequence[int]]], torch.Tensor]
"""Histories as catalog rows → (rows, items) float32 scores on the CPU."""

SELECTION_METRIC = "ndcg@10"
"""What the choices maximize (SASRec's checkpoint is chosen on it too)."""
BATCH_SIZE = 512


class Rows(NamedTuple):
    """The rows a choice is scored on (the validation selection half), as catalog rows."""

    histories: list[list[int]]
    targets: np.ndarray
    exclude: list[list[int]] | None
    """Per row, the items it may not recommend (None: none)."""


class Choice(NamedTuple):
    """The grid value kept and every value's mean selection metric."""

    value: float
    scores: dict[float, float]
    """Value tried → mean :data:`SELECTION_METRIC` on the rows (in the order tried)."""


def sasrec_scorer(model: SASRec) -> Scorer:
    """SASRec's log-softmax scores (the ranking of its raw scores, on a softmax's scale)."""
    device = next(model.parameters()).device

    def score(histories: Sequence[Sequence[int]]) -> torch.Tensor:
        with model.inference():
            hidden = model(_pad_left(histories, model.config.max_len).to(device))[:, -1]
            return model.scores(hidden).float().log_softmax(-1).cpu()

    return score


def ease_scorer(model: EASE) -> Scorer:
    def score(histories: Sequence[Sequence[int]]) -> torch.Tensor:
        return torch.from_numpy(model.encoded_inputs(histories) @ model.weights)

    return score


def blend_scorer(sasrec: Scorer, ease: Scorer, alpha: float) -> Scorer:
    """:func:`models.baselines.ease.blend` of the two scorers at weight ``alpha``."""

    def score(histories: Sequence[Sequence[int]]) -> torch.Tensor:
        return blend(sasrec(histories), ease(histories), alpha)

    return score


def rank(
    scorer: Scorer,
    histories: list[list[int]],
    k: int,
    *,
    exclude: list[list[int]] | None = None,
    batch_size: int = BATCH_SIZE,
) -> np.ndarray:
    """(rows, k) int64 top-k catalog rows per history, each row without its ``exclude`` items
    (-1 where fewer than k remain)."""
    out = [np.empty((0, k), dtype=np.int64)]
    for start, batch in _batches(histories, batch_size):
        banned = None if exclude is None else exclude[start : start + len(batch)]
        out.append(topk_from_scores(scorer(batch), k, exclude=banned))
    return np.concatenate(out)


def choose_l2(
    *,
    item_ids: Sequence[str],
    train: pd.DataFrame,
    recency: float,
    grid: Sequence[float],
    rows: Rows,
    edge_steps: int = 0,
    batch_size: int = BATCH_SIZE,
) -> tuple[Choice, EASE]:
    """EASE fitted on ``train`` at each L2 of ``grid`` (``XᵀX`` computed once), scored on
    ``rows``; returns the choice (ties: the earlier value) and the model fitted at it.

    Where the best is the grid's smallest or largest value (of two or more), up to
    ``edge_steps`` values past that edge are tried too, each one grid ratio (that of the two
    values nearest the edge) further out, for as long as each one improves on the best."""
    if not grid:
        raise ValueError("the L2 grid is empty; give at least one value")
    gram: np.ndarray | None = None
    scores: dict[float, float] = {}
    best: EASE | None = None

    def fit(l2: float) -> bool:
        """Score EASE at ``l2``; True where it is the new best."""
        nonlocal gram, best
        model = EASE(item_ids=item_ids, l2=l2, recency=recency)
        gram = model.gram(train) if gram is None else gram
        (scores[model.l2],) = _mean_metric(
            _alone(ease_scorer(model.fit_gram(gram))), rows, batch_size
        ).values()
        if best is None or scores[model.l2] > scores[best.l2]:
            best = model
            return True
        return False

    for l2 in grid:
        fit(l2)
    assert best is not None
    ordered = sorted(set(grid))
    if len(ordered) > 1 and best.l2 in (ordered[0], ordered[-1]):
        step = ordered[0] / ordered[1] if best.l2 == ordered[0] else ordered[-1] / ordered[-2]
        for _ in range(edge_steps):
            if not fit(best.l2 * step):
                break
    return Choice(best.l2, scores), best


def choose_alpha(
    *,
    sasrec: Scorer,
    ease: Scorer,
    alphas: Sequence[float],
    rows: Rows,
    batch_size: int = BATCH_SIZE,
) -> Choice:
    """The blend weight of ``alphas`` that scores best on ``rows`` (ties: the earlier value);
    each batch's SASRec and EASE scores are computed once for every α."""
    if not alphas:
        raise ValueError("the blend's α grid is empty; give at least one value")
    grid = [float(a) for a in alphas]

    def blends(batch: list[list[int]]) -> Iterator[tuple[float, torch.Tensor]]:
        s, e = sasrec(batch), ease(batch)
        return ((a, blend(s, e, a)) for a in grid)

    scores = _mean_metric(blends, rows, batch_size)
    best = max(grid, key=lambda a: (scores[a], -grid.index(a)))
    return Choice(best, scores)


def _alone(scorer: Scorer) -> Callable[[list[list[int]]], list[tuple[float, torch.Tensor]]]:
    """One candidate for :func:`_mean_metric`: ``scorer`` under key 0."""
    return lambda batch: [(0.0, scorer(batch))]


def _mean_metric(
    score_batch: Callable[[list[list[int]]], Iterable[tuple[float, torch.Tensor]]],
    rows: Rows,
    batch_size: int,
) -> dict[float, float]:
    """Mean :data:`SELECTION_METRIC` on ``rows`` of each candidate ``score_batch`` yields
    (key, scores) for, batch by batch."""
    if not rows.histories:
        raise ValueError("no rows to choose on")
    k = int(SELECTION_METRIC.split("@")[1])
    sums: dict[float, float] = {}
    for start, batch in _batches(rows.histories, batch_size):
        targets = rows.targets[start : start + len(batch)]
        exclude = None if rows.exclude is None else rows.exclude[start : start + len(batch)]
        for key, scores in score_batch(batch):
            topk = topk_from_scores(scores, k, exclude=exclude)
            hits = per_row_metrics(topk, targets, (k,))[SELECTION_METRIC]
            sums[key] = sums.get(key, 0.0) + float(hits.sum())
    return {key: total / len(rows.histories) for key, total in sums.items()}


def _batches(histories: list[list[int]], batch_size: int) -> list[tuple[int, list[list[int]]]]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [
        (start, histories[start : start + batch_size])
        for start in range(0, len(histories), batch_size)
    ]
