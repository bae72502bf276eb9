from __future__ import annotations

import numpy as np
import pytest

from models.collisions import CatalogTooLarge, resolve_collisions
from models.sid import collision_stats


def _costs_from(distances: np.ndarray):
    return lambda rows: distances[rows]


def test_colliding_items_move_to_their_nearest_free_code():
    codes = np.array([[0, 1], [0, 1], [0, 2], [1, 1]])
    # item 0 is closer to code 1 than item 1; item 1's next best free code is 3
    distances = np.array([[5, 0.1, 5, 5], [5, 0.5, 5, 0.7], [5, 5, 0.1, 5], [5, 0.1, 5, 5]])
    res = resolve_collisions(codes, codebook_size=4, last_level_costs=_costs_from(distances))
    assert res.codes.tolist() == [[0, 1], [0, 3], [0, 2], [1, 1]]
    assert res.reassigned == 1 and not res.extra_level


def test_fixed_items_never_move():
    codes = np.array([[0, 1], [0, 1]])
    distances = np.array([[9.0, 0.0, 9.0], [9.0, 0.0, 9.0]])
    fixed = np.array([False, True])
    res = resolve_collisions(
        codes, codebook_size=3, last_level_costs=_costs_from(distances), fixed=fixed
    )
    assert res.codes[1].tolist() == [0, 1] and res.codes[0].tolist() != [0, 1]


def test_overfull_prefix_group_gets_an_extra_level_for_every_sid():
    codes = np.array([[0, 0]] * 3 + [[1, 0]])
    distances = np.zeros((4, 2))
    res = resolve_collisions(codes, codebook_size=2, last_level_costs=_costs_from(distances))
    assert res.extra_level and res.codes.shape == (4, 3)
    assert collision_stats(res.codes).collision_rate == 0.0
    assert res.codes[3].tolist() == [1, 0, 0]


def test_imported_map_without_residuals_gets_an_extra_level():
    codes = np.array([[3, 4], [3, 4], [5, 6]])
    res = resolve_collisions(codes, codebook_size=8, last_level_costs=None)
    assert res.codes.tolist() == [[3, 4, 0], [3, 4, 1], [5, 6, 0]]


def test_too_many_identical_items_is_an_error():
    with pytest.raises(CatalogTooLarge, match="3 items share one SID"):
        resolve_collisions(np.zeros((3, 2), dtype=int), codebook_size=2, last_level_costs=None)


def test_random_codes_always_end_unique():
    rng = np.random.default_rng(0)
    for _ in range(20):
        codes = rng.integers(0, 4, size=(40, 3))
        distances = rng.random((40, 4))
        res = resolve_collisions(codes, codebook_size=4, last_level_costs=_costs_from(distances))
        assert collision_stats(res.codes).collision_rate == 0.0
        assert len({len(r) for r in res.codes.tolist()}) == 1
