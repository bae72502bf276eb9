"""Collaborative item factors: co-consumed items end up close, the basis folds items in again."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from models.item_factors import CollaborativeBasis, fit_item_factors, fold_in

ITEMS = [f"i{k}" for k in range(7)]  # i6: nobody consumed it


def _two_communities(seed: int = 0) -> tuple[list[str], list[str]]:
    """Users u0-u9 consume items of {i0, i1, i2}, users u10-u19 of {i3, i4, i5}; each pair
    is drawn with probability 0.8, every pair is listed twice (repeats count once)."""
    rng = np.random.default_rng(seed)
    users, items = [], []
    for u in range(20):
        group = ITEMS[:3] if u < 10 else ITEMS[3:6]
        for item in group:
            if rng.random() < 0.8:
                users += [f"u{u}", f"u{u}"]
                items += [item, item]
    return users, items


def test_co_consumed_items_are_closer_than_never_co_consumed_ones():
    users, items = _two_communities()
    fitted = fit_item_factors(users, items, item_ids=ITEMS, dim=2, seed=0)
    f = fitted.factors
    assert f.shape == (7, 2) and f.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(f[:6], axis=1), 1.0, atol=1e-6)
    cos = f @ f.T
    within = [cos[0, 1], cos[0, 2], cos[3, 4], cos[4, 5]]
    across = [cos[0, 3], cos[1, 4], cos[2, 5]]
    assert min(within) > 0.9 and max(np.abs(across)) < 0.1
    # the saved basis maps the same interactions to the same factors, and the SVD is seeded
    np.testing.assert_allclose(
        fold_in(users, items, item_ids=ITEMS, basis=fitted.basis).factors, f, atol=1e-6
    )
    again = fit_item_factors(users, items, item_ids=ITEMS, dim=2, seed=0)
    assert np.array_equal(again.factors, f)


def test_items_without_interactions_get_a_zero_row():
    users, items = _two_communities()
    fitted = fit_item_factors(users, items, item_ids=ITEMS, dim=2, seed=0)
    assert fitted.without_interactions.tolist() == [False] * 6 + [True]
    assert not fitted.factors[6].any()
    # folding in: a new item consumed by community-one users lands beside i0; one consumed
    # only by users the basis never saw has no usable interactions
    new_ids = [*ITEMS, "new", "stranger"]
    folded = fold_in(
        [*users, "u1", "u2", "u3", "nobody"],
        [*items, "new", "new", "new", "stranger"],
        item_ids=new_ids,
        basis=fitted.basis,
    )
    assert folded.without_interactions.tolist() == [False] * 6 + [True, False, True]
    assert folded.factors[7] @ folded.factors[0] > 0.9 and not folded.factors[8].any()


def test_basis_survives_a_weights_only_save():
    users, items = _two_communities()
    basis = fit_item_factors(users, items, item_ids=ITEMS, dim=2, seed=0).basis
    buffer = io.BytesIO()
    torch.save(basis.state(), buffer)
    buffer.seek(0)
    loaded = CollaborativeBasis.from_state(torch.load(buffer, weights_only=True))
    assert loaded.user_ids == basis.user_ids
    assert np.array_equal(loaded.projection, basis.projection)


def test_bad_arguments_are_value_errors():
    users, items = _two_communities()
    with pytest.raises(ValueError, match=r"dim must be between 1 and min\(users, items\) - 1 = 6"):
        fit_item_factors(users, items, item_ids=ITEMS, dim=7, seed=0)
    with pytest.raises(ValueError, match=r"1 item\(s\) outside item_ids, e.g. \['i5'\]"):
        fit_item_factors(users, items, item_ids=ITEMS[:5], dim=2, seed=0)
