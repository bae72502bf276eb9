"""Ranking with EASE and the SASRec + EASE blend, and the choice of EASE's L2 and the blend's
weight, against the same computations done directly in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.baselines import encode_histories, encode_targets
from models.baselines.blend import (
    Rows,
    blend_scorer,
    choose_alpha,
    choose_l2,
    ease_scorer,
    rank,
    sasrec_scorer,
)
from models.baselines.ease import EASE, blend
from models.baselines.sasrec import SASRec, SASRecConfig, recommend

ITEMS = [f"i{i}" for i in range(24)]


def _sequences() -> dict[str, list[str]]:
    """30 users walking the catalog with steps of 1 to 3 (seeded), 9 items each."""
    rng = np.random.default_rng(0)
    out = {}
    for u in range(30):
        start, steps = int(rng.integers(24)), rng.integers(1, 4, size=8)
        out[f"u{u}"] = [ITEMS[(start + int(s)) % 24] for s in np.cumsum([0, *steps])]
    return out


@pytest.fixture
def data(split_rows):
    splits = split_rows(_sequences(), 5)
    index = {item: i for i, item in enumerate(ITEMS)}
    valid = splits["valid"]
    seen = [
        sorted({index[i] for i in h}) for h in valid["history"]
    ]  # the history stands in for every seen item here
    rows = Rows(
        histories=encode_histories(list(valid["history"]), index),
        targets=encode_targets(list(valid["target"]), index),
        exclude=seen,
    )
    return splits["train"], rows


def _sasrec() -> SASRec:
    torch.manual_seed(0)
    config = SASRecConfig(hidden=8, heads=2, blocks=1, max_len=5, dropout=0.0)
    return SASRec(item_ids=ITEMS, config=config)


def _ndcg10(scores: np.ndarray, rows: Rows) -> float:
    """Mean NDCG@10 of dense scores, each row's excluded items removed, in numpy."""
    scores = scores.astype(np.float64).copy()
    for row, items in enumerate(rows.exclude or []):
        scores[row, items] = -np.inf
    target = scores[np.arange(len(scores)), rows.targets]
    position = (scores > target[:, None]).sum(1)
    return float(np.where(position < 10, 1 / np.log2(position + 2), 0.0).mean())


def test_ease_ranks_by_its_closed_form_scores(data):
    """Top-k of EASE = the k best of (recency-weighted history) · B, seen items removed,
    computed directly in numpy (compared by score, so ties may come in any order)."""
    train, rows = data
    model = EASE(item_ids=ITEMS, l2=10.0, recency=0.5).fit(train)
    topk = rank(ease_scorer(model), rows.histories, 5, exclude=rows.exclude, batch_size=7)
    for row, history in enumerate(rows.histories):
        inputs = np.zeros(len(ITEMS))
        for age, item in enumerate(reversed(history)):
            inputs[item] = max(inputs[item], 0.5**age)
        scores = (inputs @ model.weights.astype(np.float64)).astype(np.float32)
        allowed = np.setdiff1d(np.arange(len(ITEMS)), rows.exclude[row])
        expected = np.sort(scores[allowed])[::-1][:5]
        np.testing.assert_allclose(scores[topk[row]], expected, rtol=1e-5, atol=1e-6)
        assert not set(topk[row]) & set(rows.exclude[row])


def test_the_blend_at_zero_is_sasrec_and_at_one_sums_the_standardized_scores(data):
    train, rows = data
    sasrec, ease = _sasrec(), EASE(item_ids=ITEMS, l2=10.0).fit(train)
    s, e = sasrec_scorer(sasrec), ease_scorer(ease)
    # α = 0: SASRec's own ranking, as recommend() ranks
    histories = [[ITEMS[i] for i in h] for h in rows.histories]
    excluded = [[ITEMS[i] for i in h] for h in rows.exclude]
    np.testing.assert_array_equal(
        rank(blend_scorer(s, e, 0.0), rows.histories, 10, exclude=rows.exclude),
        recommend(sasrec, histories, 10, exclude=excluded),
    )
    # α = 1: z(sasrec) + z(ease), each standardized per row (numpy's sd with ddof 1)
    sas, eas = s(rows.histories).numpy(), e(rows.histories).numpy()

    def z(values: np.ndarray) -> np.ndarray:
        centred = values - values.mean(1, keepdims=True)
        sd = centred.std(1, ddof=1, keepdims=True)
        return np.where(sd > 0, centred / np.where(sd > 0, sd, 1), 0.0)

    both = blend(torch.from_numpy(sas), torch.from_numpy(eas), 1.0).numpy()
    # it keeps SASRec's scale: standardized by SASRec's sd it is the sum of the z-scores
    standardized = (both - both.mean(1, keepdims=True)) / sas.std(1, ddof=1, keepdims=True)
    np.testing.assert_allclose(standardized, z(sas) + z(eas), rtol=1e-4, atol=1e-4)
    topk = rank(blend_scorer(s, e, 1.0), rows.histories, 5)
    expected = np.sort(z(sas) + z(eas), axis=1)[:, ::-1][:, :5]
    np.testing.assert_allclose(
        np.take_along_axis(z(sas) + z(eas), topk, 1), expected, rtol=1e-4, atol=1e-4
    )


def test_choose_l2_keeps_the_best_value_of_the_grid(data):
    train, rows = data
    choice, model = choose_l2(
        item_ids=ITEMS, train=train, recency=0.9, grid=[0.5, 20.0, 500.0], rows=rows, batch_size=8
    )
    expected = {}
    for l2 in (0.5, 20.0, 500.0):
        fitted = EASE(item_ids=ITEMS, l2=l2, recency=0.9).fit(train)
        expected[l2] = _ndcg10(fitted.inputs(rows.histories) @ fitted.weights, rows)
    assert choice.scores == pytest.approx(expected, abs=1e-9)
    assert choice.value == max(expected, key=expected.__getitem__) == model.l2
    np.testing.assert_array_equal(
        model.weights, EASE(item_ids=ITEMS, l2=choice.value, recency=0.9).fit(train).weights
    )


@pytest.mark.parametrize(
    ("grid", "edge_steps", "tried", "kept"),
    [
        # the best is the top edge: ×10/3 past it while it improves (3.3 and 11.1 do, 37 not)
        ([0.3, 1.0], 3, [0.3, 1.0, 10 / 3, 100 / 9, 1000 / 27], 100 / 9),
        # the bottom edge: ×0.3 twice, both better, then the steps run out
        ([300.0, 1000.0], 2, [300.0, 1000.0, 90.0, 27.0], 27.0),
        ([300.0, 1000.0], 0, [300.0, 1000.0], 300.0),
        ([1.0, 10.0, 100.0], 2, [1.0, 10.0, 100.0], 10.0),  # an inner best: the grid alone
    ],
)
def test_choose_l2_goes_past_the_grid_edge_while_it_improves(data, grid, edge_steps, tried, kept):
    """On these rows NDCG@10 rises with L2 up to ~10 and falls after it."""
    train, rows = data
    choice, model = choose_l2(
        item_ids=ITEMS, train=train, recency=0.9, grid=grid, rows=rows, edge_steps=edge_steps
    )
    assert list(choice.scores) == pytest.approx(tried)
    for l2, score in choice.scores.items():
        fitted = EASE(item_ids=ITEMS, l2=l2, recency=0.9).fit(train)
        assert score == pytest.approx(_ndcg10(fitted.inputs(rows.histories) @ fitted.weights, rows))
    assert choice.value == pytest.approx(kept) and model.l2 == choice.value


def test_choose_alpha_keeps_the_best_weight_and_the_earlier_of_ties():
    """SASRec ranks each target last, EASE first: α 0 misses every target, and every α that
    lets EASE lead hits it first (a tie the earlier α wins)."""
    targets = np.array([0, 1, 2])
    rows = Rows(histories=[[3], [4], [5]], targets=targets, exclude=None)
    first = torch.nn.functional.one_hot(torch.from_numpy(targets), 12).float()

    def sasrec(histories):
        return -first[: len(histories)] + 0.01 * torch.arange(12.0)

    def ease(histories):
        return first[: len(histories)]

    choice = choose_alpha(sasrec=sasrec, ease=ease, alphas=[0.0, 10.0, 20.0], rows=rows)
    assert choice.scores == {0.0: 0.0, 10.0: 1.0, 20.0: 1.0} and choice.value == 10.0
    with pytest.raises(ValueError, match="α grid is empty"):
        choose_alpha(sasrec=sasrec, ease=ease, alphas=[], rows=rows)
