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


def _duplicates(n: int, k: int, copies: int, levels: int = 3, seed: int = 0):
    """``n`` random codes and last-level distances over ``k`` codes, rows 1..copies-1 copies of
    row 0 (identical embeddings: identical codes and distances)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, k, size=(n, levels))
    distances = rng.random((n, k))
    codes[1:copies], distances[1:copies] = codes[0], distances[0]
    return codes, distances


@pytest.mark.parametrize("levels", [3, 6])
@pytest.mark.parametrize("with_costs", [True, False])
def test_more_identical_items_than_codes_spread_over_their_prefix_group(levels, with_costs):
    # 20 identical items, K=8: the old extra level numbered them within their one SID (20 > 8)
    codes, distances = _duplicates(120, 8, copies=20, levels=levels)
    costs = _costs_from(distances) if with_costs else None
    res = resolve_collisions(codes, codebook_size=8, last_level_costs=costs)
    assert res.extra_level and res.codes.shape == (120, levels + 1)
    assert collision_stats(res.codes).collision_rate == 0.0
    assert res.codes.min() >= 0 and res.codes.max() < 8
    assert (res.codes[:20, :-2] == codes[0, :-1]).all()  # they stay in their prefix group
    # items whose SID was unique keep it, with index 0
    unique_sid = (codes[:, None] == codes[None]).all(axis=2).sum(axis=1) == 1
    assert (res.codes[unique_sid] == np.column_stack([codes, np.zeros(120, int)])[unique_sid]).all()
    again = resolve_collisions(codes, codebook_size=8, last_level_costs=costs)
    assert (again.codes == res.codes).all()  # deterministic


def test_overflow_takes_the_nearest_free_last_codes():
    # 11 identical items, K=4: step 1 moves one to each of codes 1, 2, 3; code 0 keeps indices
    # 0-3; the other 4 take code 2 (distance 0.1) until it is full, then code 1 (0.3)
    codes = np.zeros((11, 2), dtype=int)
    distances = np.tile([0.0, 0.3, 0.1, 0.9], (11, 1))
    res = resolve_collisions(codes, codebook_size=4, last_level_costs=_costs_from(distances))
    assert collision_stats(res.codes).collision_rate == 0.0 and res.codes.shape == (11, 3)
    assert np.bincount(res.codes[:, 1], minlength=4).tolist() == [4, 2, 4, 1]
    assert sorted(res.codes[res.codes[:, 1] == 2, 2].tolist()) == [0, 1, 2, 3]
    assert res.reassigned == 7  # 3 by step 1, 4 by the extra level


def test_overflow_without_costs_keeps_tiger_indices_first():
    codes = np.array([[0, 0]] * 3 + [[1, 0]])
    res = resolve_collisions(codes, codebook_size=2, last_level_costs=None)
    # two indices of SID (0, 0) are taken; the third item moves to the free code 1 of prefix 0
    assert res.codes.tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0]]


def test_fixed_items_keep_their_codes_and_index_0_under_an_extra_level():
    codes = np.array([[0, 0], [0, 0], [0, 0], [0, 1]])
    fixed = np.array([False, True, False, True])
    res = resolve_collisions(codes, codebook_size=2, last_level_costs=None, fixed=fixed)
    assert res.codes.tolist() == [[0, 0, 1], [0, 0, 0], [0, 1, 1], [0, 1, 0]]
    # with costs: fixed items keep their last code through step 1 as well
    fixed = np.zeros(12, dtype=bool)
    fixed[[3, 7]] = True
    codes, distances = _duplicates(12, 4, copies=12, levels=2)
    res = resolve_collisions(
        codes, codebook_size=4, last_level_costs=_costs_from(distances), fixed=fixed
    )
    assert res.codes[fixed].tolist() == [[*codes[0], 0], [*codes[0], 1]]
    assert collision_stats(res.codes).collision_rate == 0.0 and res.codes.max() < 4


def test_more_fixed_items_on_one_sid_than_indices_is_an_error():
    with pytest.raises(CatalogTooLarge, match=r"3 items that keep their SID share \(0, 0\)"):
        resolve_collisions(
            np.zeros((3, 2), dtype=int),
            codebook_size=2,
            last_level_costs=None,
            fixed=np.ones(3, dtype=bool),
        )


@pytest.mark.parametrize(
    ("codes", "advice"),
    [
        # 5 identical items: more levels cannot separate them
        (
            [[0, 0]] * 5,
            r"5 items share the SID prefix \(0,\): more than the 2x2 = 4 \(last code, extra "
            r"index\) pairs .*; all of them have identical codes at every level, i.e. "
            r"\(near-\)identical embeddings such as duplicate texts: de-duplicate the catalog or "
            r"use sids.embedding=hybrid .* more sids.levels does not",
        ),
        # 5 items, 3 alike: a larger codebook or more levels do help
        (
            [[1, 0, 0]] * 3 + [[1, 0, 1]] * 2,
            r"5 items share the SID prefix \(1, 0\): .*; increase sids.codebook_size or "
            r"sids.levels \(3 of them have identical codes at every level",
        ),
    ],
)
def test_a_prefix_group_beyond_k_squared_is_an_error_naming_it(codes, advice):
    with pytest.raises(CatalogTooLarge, match=advice):
        resolve_collisions(np.array(codes), codebook_size=2, last_level_costs=None)


def test_random_codes_always_end_unique():
    rng = np.random.default_rng(0)
    for _ in range(20):
        codes = rng.integers(0, 4, size=(40, 3))
        distances = rng.random((40, 4))
        res = resolve_collisions(codes, codebook_size=4, last_level_costs=_costs_from(distances))
        assert collision_stats(res.codes).collision_rate == 0.0
        assert len({len(r) for r in res.codes.tolist()}) == 1


@pytest.mark.parametrize("with_costs", [True, False])
def test_prefix_groups_of_exactly_k_squared_duplicates_fill_every_pair(with_costs):
    rng = np.random.default_rng(1)
    for _ in range(20):
        codes = np.column_stack([np.arange(32) % 2, rng.integers(0, 2, 32)])  # 16 per prefix
        costs = _costs_from(rng.random((32, 4))) if with_costs else None
        res = resolve_collisions(codes, codebook_size=4, last_level_costs=costs)
        assert collision_stats(res.codes).collision_rate == 0.0
        assert res.codes.max() < 4 and (res.codes[:, 0] == codes[:, 0]).all()


def test_new_items_take_free_extra_level_indices_and_known_sids_stay():
    # 2 levels + a disambiguation level: (1, 2) holds indices 0 and 2, (3, 3) holds 0
    codes = np.array([[1, 2], [1, 2], [3, 3], [1, 2], [1, 2], [5, 5]])
    held = np.array([0, 2, 0, 9, 9, 9])  # the new rows' values are never read
    known = np.array([True, True, True, False, False, False])
    res = resolve_collisions(codes, codebook_size=16, last_level_costs=None, fixed=known, held=held)
    assert res.extra_level and res.reassigned == 0
    assert res.codes[known].tolist() == [[1, 2, 0], [1, 2, 2], [3, 3, 0]]  # known SIDs never move
    assert res.codes[3:, -1].tolist() == [1, 3, 0]  # the lowest free index per SID
    assert len({tuple(r) for r in res.codes.tolist()}) == len(codes)


def test_a_new_item_on_a_full_sid_takes_a_free_index_of_another_last_code():
    # k = 3: SID (1, 2) holds indices 0, 1 and 2; (1, 0) holds 1; the prefix 1 has room left
    codes = np.array([[1, 2], [1, 2], [1, 2], [1, 0], [1, 2], [1, 2], [1, 2]])
    held = np.array([0, 1, 2, 1, 0, 0, 0])
    known = np.array([True] * 4 + [False] * 3)

    def costs(rows):  # last code 0 is the nearest to every new item, then 1, then 2
        return np.tile([0.0, 1.0, 2.0], (len(rows), 1))

    res = resolve_collisions(codes, codebook_size=3, last_level_costs=costs, fixed=known, held=held)
    # code 0's free indices, lowest first, then code 1's
    assert res.codes[4:].tolist() == [[1, 0, 0], [1, 0, 2], [1, 1, 0]] and res.reassigned == 3
    assert res.codes[known].tolist() == [[1, 2, 0], [1, 2, 1], [1, 2, 2], [1, 0, 1]]
    full = np.array([[1, 0], [1, 0], [1, 1], [1, 1], [1, 1]])
    with pytest.raises(CatalogTooLarge, match=r"5 items share the SID prefix \(1,\): more than"):
        resolve_collisions(
            full,
            codebook_size=2,
            last_level_costs=None,
            fixed=np.array([True] * 4 + [False]),
            held=np.array([0, 1, 0, 1, 0]),
        )


def test_random_extensions_of_a_map_with_an_extra_level_keep_it_and_stay_unique():
    rng = np.random.default_rng(2)
    for _ in range(200):
        k, levels = int(rng.integers(2, 5)), int(rng.integers(1, 3))
        codes = rng.integers(0, k, size=(int(rng.integers(k * k // 2 + 1, 16)), levels))
        try:  # a map with an extra level (k**levels codes of k**levels + 1 items collide)
            full = resolve_collisions(codes, codebook_size=k, last_level_costs=None).codes
        except CatalogTooLarge:
            continue
        if full.shape[1] == levels:
            continue
        known = full[rng.random(len(full)) < 0.6]
        new = rng.integers(0, k, size=(int(rng.integers(1, 8)), levels))
        merged = np.vstack([known[:, :-1], new])
        fixed = np.arange(len(merged)) < len(known)
        held = np.r_[known[:, -1], np.zeros(len(new), dtype=int)]
        costs = _costs_from(rng.random((len(merged), k)))
        prefixes = np.unique(merged[:, :-1], axis=0, return_counts=True)[1]
        if prefixes.max() > k * k:  # more items on one prefix than its (last code, index) pairs
            with pytest.raises(CatalogTooLarge, match="pairs an extra level gives them"):
                resolve_collisions(
                    merged, codebook_size=k, last_level_costs=costs, fixed=fixed, held=held
                )
            continue
        res = resolve_collisions(
            merged, codebook_size=k, last_level_costs=costs, fixed=fixed, held=held
        )
        assert (res.codes[fixed] == known).all() and res.extra_level
        assert collision_stats(res.codes).collision_rate == 0.0 and res.codes.max() < k
        assert (res.codes[:, :-2] == merged[:, :-1]).all()  # only the last code may move
