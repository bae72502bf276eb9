"""Ranking metrics on hand-made rankings whose HR / NDCG are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.metrics import rank_metrics, topk_from_scores


def test_hand_made_ranking_gives_exact_hr_and_ndcg() -> None:
    topk = np.array([[3, 1, 2], [0, 5, 4], [7, 8, 9]])
    targets = np.array([1, 4, 6])  # ranks 1, 2 and a miss
    m = rank_metrics(topk, targets, ks=(1, 2, 3))
    assert m["hr@1"] == 0.0 and m["ndcg@1"] == 0.0
    assert m["hr@2"] == pytest.approx(1 / 3)
    assert m["ndcg@2"] == pytest.approx((1 / math.log2(3)) / 3)
    assert m["hr@3"] == pytest.approx(2 / 3)
    assert m["ndcg@3"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(4)) / 3)


def test_hit_at_first_position_scores_one_and_default_keys() -> None:
    topk = np.tile(np.arange(20), (2, 1))
    m = rank_metrics(topk, np.array([0, 0]))
    assert list(m) == ["hr@1", "ndcg@1", "hr@5", "ndcg@5", "hr@10", "ndcg@10", "hr@20", "ndcg@20"]
    assert all(v == 1.0 for v in m.values())


def test_invalid_entries_never_hit_and_are_not_duplicates() -> None:
    topk = np.array([[-1, 2, -1], [-1, -1, -1]])
    m = rank_metrics(topk, np.array([2, 0]), ks=(1, 3))
    assert m["hr@1"] == 0.0
    assert m["hr@3"] == 0.5
    assert m["ndcg@3"] == pytest.approx(0.5 / math.log2(3))


def test_duplicate_item_in_a_row_is_rejected_naming_the_row() -> None:
    topk = np.array([[0, 1, 2], [4, 5, 4]])
    with pytest.raises(ValueError, match="row 1 recommends the same item twice"):
        rank_metrics(topk, np.array([0, 4]), ks=(3,))


@pytest.mark.parametrize(
    ("topk", "targets", "ks", "match"),
    [
        (np.zeros((2, 5), dtype=int), np.zeros(2, dtype=int), (10,), "at K=10"),
        (np.zeros((2, 1), dtype=int), np.zeros(3, dtype=int), (1,), "one item index per topk row"),
        (np.zeros(4, dtype=int), np.zeros(4, dtype=int), (1,), "2-D"),
        (np.zeros((0, 1), dtype=int), np.zeros(0, dtype=int), (1,), "empty"),
        (np.zeros((1, 1), dtype=int), np.array([-1]), (1,), "row 0 has -1"),
        (np.array([[-2]]), np.array([0]), (1,), "indices < -1"),
        (np.zeros((1, 1)), np.array([0]), (1,), "integer"),
        (np.zeros((1, 1), dtype=int), np.array([0]), (0,), "positive ints"),
    ],
)
def test_bad_inputs_raise(
    topk: np.ndarray, targets: np.ndarray, ks: tuple[int, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        rank_metrics(topk, targets, ks=ks)


def test_topk_from_scores_ranks_full_catalog_and_excludes_on_request() -> None:
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.4, 0.0, 0.2, 0.8]])
    assert topk_from_scores(scores, 2).tolist() == [[1, 2], [3, 0]]
    assert topk_from_scores(scores, 2, exclude=[[1], []]).tolist() == [[2, 3], [3, 0]]


def test_topk_from_scores_pads_with_minus_one_when_items_run_out() -> None:
    scores = torch.tensor([[0.1, 0.9, 0.5]])
    assert topk_from_scores(scores, 5).tolist() == [[1, 2, 0, -1, -1]]
    assert topk_from_scores(scores, 3, exclude=[[0, 2]]).tolist() == [[1, -1, -1]]


@pytest.mark.parametrize(
    ("k", "exclude", "match"),
    [
        (0, None, "positive int"),
        (1, [[0], [1]], "one index list per score row"),
        (1, [[3]], "row 0 holds indices outside"),
    ],
)
def test_topk_from_scores_bad_inputs_raise(
    k: int, exclude: list[list[int]] | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        topk_from_scores(torch.zeros(1, 3), k, exclude=exclude)
