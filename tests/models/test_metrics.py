"""Ranking metrics on hand-made rankings whose HR / NDCG are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.metrics import (
    catalog_coverage,
    per_row_metrics,
    popularity_percentile,
    popularity_percentiles,
    rank_metrics,
    topk_from_scores,
)


def test_hand_made_ranking_gives_exact_hr_and_ndcg() -> None:
    topk = np.array([[3, 1, 2], [0, 5, 4], [7, 8, 9]])
    targets = np.array([1, 4, 6])  # ranks 1, 2 and a miss
    m = rank_metrics(topk, targets, ks=(1, 2, 3))
    assert m["hr@1"] == 0.0 and m["ndcg@1"] == 0.0
    assert m["hr@2"] == pytest.approx(1 / 3)
    assert m["ndcg@2"] == pytest.approx((1 / math.log2(3)) / 3)
    assert m["hr@3"] == pytest.approx(2 / 3)
    assert m["ndcg@3"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(4)) / 3)


def test_per_row_metrics_are_exact_per_user_values() -> None:
    topk = np.array([[3, 1, 2], [0, 5, 4], [7, 8, 9], [6, -1, -1]])
    targets = np.array([1, 4, 6, 6])  # ranks 1, 2, a miss, 0
    m = per_row_metrics(topk, targets, ks=(1, 3))
    assert list(m) == ["hr@1", "ndcg@1", "hr@3", "ndcg@3"]
    assert all(v.dtype == np.float64 and v.shape == (4,) for v in m.values())
    assert m["hr@1"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert m["ndcg@1"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert m["hr@3"].tolist() == [1.0, 1.0, 0.0, 1.0]
    np.testing.assert_allclose(m["ndcg@3"], [1 / math.log2(3), 0.5, 0.0, 1.0])


def test_rank_metrics_is_the_mean_of_per_row_metrics() -> None:
    rng = np.random.default_rng(0)
    topk = np.stack([rng.permutation(50)[:20] for _ in range(200)])
    topk[rng.random(topk.shape) < 0.1] = -1
    targets = rng.integers(0, 50, size=200)
    per_row = per_row_metrics(topk, targets)
    means = rank_metrics(topk, targets)
    assert list(means) == list(per_row)
    assert 0.0 < means["hr@20"] < 1.0
    assert means == {name: float(v.mean()) for name, v in per_row.items()}


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


def test_catalog_coverage_counts_distinct_items_within_k() -> None:
    topk = np.array([[0, 1, 5], [1, -1, 4], [1, 0, -1]])
    assert catalog_coverage(topk, n_items=10, k=2) == pytest.approx(2 / 10)  # items 0, 1
    assert catalog_coverage(topk, n_items=10, k=3) == pytest.approx(4 / 10)  # + 4, 5
    assert catalog_coverage(np.full((2, 3), -1), n_items=10, k=3) == 0.0


def test_popularity_percentiles_span_0_to_100_and_average_ties() -> None:
    # sorted: item 3 (0) < items 0, 2 (5, tied ranks 1 and 2) < item 1 (9)
    np.testing.assert_allclose(popularity_percentiles(np.array([5, 9, 5, 0])), [50, 100, 50, 0])
    np.testing.assert_allclose(popularity_percentiles(np.array([3, 3, 3])), [50, 50, 50])
    assert popularity_percentiles(np.array([7])).tolist() == [50.0]


def test_popularity_percentile_averages_every_recommendation() -> None:
    counts = np.array([0, 10, 20, 30, 40])  # percentiles 0, 25, 50, 75, 100
    topk = np.array([[4, 3, 0], [4, -1, 1]])
    # top-2 recommendations: 4, 3, 4 (the -1 is ignored)
    assert popularity_percentile(topk, counts, k=2) == pytest.approx((100 + 75 + 100) / 3)
    assert popularity_percentile(topk, counts, k=3) == pytest.approx((100 + 75 + 0 + 100 + 25) / 5)


def test_popularity_percentile_of_no_recommendation_raises() -> None:
    with pytest.raises(ValueError, match="no item was recommended in any row's top-2"):
        popularity_percentile(np.array([[-1, -1, 3]]), np.arange(5), k=2)


@pytest.mark.parametrize(
    ("topk", "n_items", "k", "match"),
    [
        (np.array([[0, 5]]), 5, 2, r"row 0 holds indices outside the catalog \[0, 5\)"),
        (np.array([[0, 1]]), 0, 2, "n_items must be a positive int"),
        (np.array([[0, 1]]), 5, 0, "k must be a positive int"),
        (np.array([[0, 1]]), 5, 3, "at K=3"),
        (np.array([[1, 1]]), 5, 2, "row 0 recommends the same item twice"),
        (np.zeros((0, 2), dtype=int), 5, 2, "empty"),
    ],
)
def test_catalog_metrics_bad_inputs_raise(
    topk: np.ndarray, n_items: int, k: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        catalog_coverage(topk, n_items, k)
    if n_items > 0:
        with pytest.raises(ValueError, match=match):
            popularity_percentile(topk, np.ones(n_items), k)


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        (np.array([]), "non-empty 1-D"),
        (np.ones((2, 2)), "non-empty 1-D"),
        (np.array([1.0, np.nan]), "finite"),
        (np.array([1, -1]), "item 1"),
    ],
)
def test_bad_counts_raise(counts: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        popularity_percentile(np.array([[0]]), counts, k=1)
