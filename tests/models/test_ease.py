"""EASE, the closed-form item-to-item model GRPO's ``ease`` reward reads."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from models.baselines.ease import EASE, MAX_ITEMS

ITEMS = [f"i{i}" for i in range(20)]
SplitRows = Callable[[dict[str, list[str]], int], dict[str, pd.DataFrame]]
"""The ``split_rows`` fixture (tests/models/conftest.py)."""


def _sequences() -> dict[str, list[str]]:
    """Users who take i0 with i1 and i2 with i3, everyone i4 (their train sequences; the last
    two items of each go to valid and test), and one user mixing both pairs."""
    pairs = {
        f"u{n}": ["i0", "i1", "i4", "i7", "i8"] if n % 2 else ["i2", "i3", "i4", "i9", "i8"]
        for n in range(20)
    }
    return {**pairs, "mix": ["i0", "i1", "i2", "i3", "i6", "i7"]}


def _fitted(split_rows: SplitRows, **options: float) -> EASE:
    return EASE(item_ids=ITEMS, **options).fit(split_rows(_sequences(), 10)["train"])


def test_ease_solves_its_closed_form(split_rows):
    model = _fitted(split_rows, l2=2.0)
    train = split_rows(_sequences(), 10)["train"]
    from models.baselines import encode_histories, train_sequences

    x = np.zeros((len(_sequences()), len(ITEMS)))
    for row, items in enumerate(encode_histories(train_sequences(train), model.index)):
        x[row, items] = 1.0
    # B minimizes ||X - XB||² + λ||B||² under diag(B) = 0, so off the diagonal its stationarity
    # condition holds: (XᵀX + λI)B - XᵀX vanishes there
    weights = model.weights.astype(np.float64)
    gradient = (x.T @ x + 2.0 * np.eye(len(ITEMS))) @ weights - x.T @ x
    off_diagonal = ~np.eye(len(ITEMS), dtype=bool)
    assert np.abs(gradient[off_diagonal]).max() < 1e-4
    assert np.all(np.diag(model.weights) == 0)


def test_ease_scores_the_co_consumed_item_first(split_rows):
    scores = _fitted(split_rows).scores([["i0"], ["i2"]])
    assert scores[0].argmax() == ITEMS.index("i1")
    assert scores[1].argmax() == ITEMS.index("i3")
    assert scores[:, ITEMS.index("i7")].max() == 0  # valid and test items are never read


def test_recency_weighs_the_newest_history_item_most(split_rows):
    model = _fitted(split_rows, recency=0.5)
    np.testing.assert_allclose(model.inputs([["i0", "i2"]])[0][[0, 2]], [0.5, 1.0])
    # the newest item leads: after i0 then i2, i3 (i2's partner) outscores i1 (i0's)
    scores = model.scores([["i0", "i2"], ["i2", "i0"]])
    assert scores[0, ITEMS.index("i3")] > scores[0, ITEMS.index("i1")]
    assert scores[1, ITEMS.index("i1")] > scores[1, ITEMS.index("i3")]
    # recency 1 reads the history as a set: the order does not matter
    flat = _fitted(split_rows, recency=1.0).scores([["i0", "i2"], ["i2", "i0"]])
    np.testing.assert_allclose(flat[0], flat[1])
    # an item seen twice keeps its newest weight; an empty history scores nothing
    np.testing.assert_allclose(model.inputs([["i0", "i2", "i0"]])[0][[0, 2]], [1.0, 0.5])
    assert not model.scores([[]]).any()


@pytest.mark.parametrize(
    ("options", "match"),
    [({"l2": 0.0}, "l2 must be > 0"), ({"recency": 0.0}, r"recency must be in \(0, 1\]")],
)
def test_ease_rejects_bad_options(options: dict[str, float], match: str):
    with pytest.raises(ValueError, match=match):
        EASE(item_ids=ITEMS, **options)


def test_ease_refuses_a_catalog_too_large_to_invert_densely():
    with pytest.raises(ValueError, match=f"above {MAX_ITEMS} items"):
        EASE(item_ids=[str(i) for i in range(MAX_ITEMS + 1)])


def test_ease_names_an_unknown_item(split_rows):
    with pytest.raises(ValueError, match="not in the catalog"):
        _fitted(split_rows).scores([["nope"]])
    bad = pd.DataFrame({"user_id": ["u"], "history": [["zz"]], "target": ["i0"], "timestamp": [1]})
    with pytest.raises(ValueError, match="not in the catalog"):
        EASE(item_ids=ITEMS).fit(bad)


def test_gram_then_fit_equals_the_dense_closed_form(split_rows):
    """``fit`` = ``fit_gram(gram)``: the closed form on the dense 0/1 matrix, computed in numpy
    (a user who takes an item twice counts it once); ``gram`` is left unchanged for the next L2."""
    from models.baselines import encode_histories, train_sequences

    sequences = {**_sequences(), "again": ["i5", "i6", "i5", "i6", "i5"]}
    train = split_rows(sequences, 10)["train"]
    model = EASE(item_ids=ITEMS, l2=3.0)
    gram = model.gram(train)
    x = np.zeros((len(sequences), len(ITEMS)))
    for row, items in enumerate(encode_histories(train_sequences(train), model.index)):
        x[row, items] = 1.0
    np.testing.assert_array_equal(gram, x.T @ x)
    inverse = np.linalg.inv(x.T @ x + 3.0 * np.eye(len(ITEMS)))
    expected = -inverse / np.diag(inverse)
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_array_equal(model.fit_gram(gram).weights, expected.astype(np.float32))
    np.testing.assert_array_equal(gram, x.T @ x)
    np.testing.assert_array_equal(EASE(item_ids=ITEMS, l2=3.0).fit(train).weights, model.weights)
    with pytest.raises(ValueError, match=r"gram must be 20 × 20"):
        model.fit_gram(gram[:3, :3])
