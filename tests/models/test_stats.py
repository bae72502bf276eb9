"""Bootstrap intervals on per-user scores whose intervals are known or can be bounded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import models.stats
from models.stats import (
    Interval,
    bootstrap_interval,
    paired_bootstrap_interval,
    paired_ratio_interval,
    seed_noise,
)


def test_interval_contains_the_mean_and_is_deterministic_for_a_seed() -> None:
    values = np.random.default_rng(0).random(300)
    interval = bootstrap_interval(values, seed=3)
    assert interval.mean == pytest.approx(values.mean())
    assert interval.low < interval.mean < interval.high
    assert bootstrap_interval(values, seed=3) == interval
    assert bootstrap_interval(values, seed=4) != interval


def test_interval_shrinks_with_more_users() -> None:
    rng = np.random.default_rng(0)
    few, many = bootstrap_interval(rng.random(100)), bootstrap_interval(rng.random(10_000))
    # width ~ 1/sqrt(n): 100x the users, ~10x narrower
    assert 5 < (few.high - few.low) / (many.high - many.low) < 20


def test_higher_confidence_gives_a_wider_interval() -> None:
    values = np.random.default_rng(0).random(200)
    narrow, wide = (bootstrap_interval(values, confidence=c) for c in (0.5, 0.99))
    assert wide.low < narrow.low < narrow.high < wide.high


def test_constant_values_give_a_point_interval() -> None:
    assert bootstrap_interval(np.full(50, 0.25)) == Interval(0.25, 0.25, 0.25)


def test_result_does_not_depend_on_the_memory_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(0).random(300)
    whole = bootstrap_interval(values, n_resamples=500)
    monkeypatch.setattr(models.stats, "MAX_RESAMPLED_VALUES", 1000)  # 3 resamples a batch
    assert bootstrap_interval(values, n_resamples=500) == whole


def test_matches_a_plain_numpy_percentile_bootstrap() -> None:
    values = np.random.default_rng(0).random(200)
    rng = np.random.default_rng(1)
    means = values[rng.integers(0, len(values), size=(20_000, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [0.05, 0.95])
    interval = bootstrap_interval(values, confidence=0.9, n_resamples=20_000)
    assert interval.low == pytest.approx(low, abs=3e-3)
    assert interval.high == pytest.approx(high, abs=3e-3)


def test_paired_interval_of_a_model_against_itself_is_exactly_zero() -> None:
    a = np.random.default_rng(0).random(100)
    assert paired_bootstrap_interval(a, a) == Interval(0.0, 0.0, 0.0)


def test_paired_interval_of_a_constant_shift_is_that_shift() -> None:
    a = np.random.default_rng(0).random(100)
    interval = paired_bootstrap_interval(a, a + 0.1)
    assert interval == pytest.approx((-0.1, -0.1, -0.1))


def test_pairing_detects_a_gap_that_unpaired_intervals_miss() -> None:
    # Per-user HR of two models on 400 users: b misses 20 of the 200 users a hits.
    a = np.zeros(400)
    a[:200] = 1.0
    b = a.copy()
    b[:20] = 0.0
    ia, ib = bootstrap_interval(a), bootstrap_interval(b)
    assert ib.low < ia.low < ib.high < ia.high  # unpaired: the intervals overlap
    diff = paired_bootstrap_interval(a, b)
    assert diff.mean == pytest.approx(0.05)
    assert 0.0 < diff.low < diff.mean < diff.high  # paired: the gap excludes 0


@pytest.mark.parametrize(
    ("values", "kwargs", "match"),
    [
        (np.array([]), {}, "has 0 value"),
        (np.array([0.5]), {}, "at least 2"),
        (np.ones((2, 2)), {}, "1-D"),
        (np.array([0.5, np.nan]), {}, "finite"),
        (np.array(["a", "b"]), {}, "finite numbers"),
        (np.ones(3), {"confidence": 1.0}, r"confidence must lie in \(0, 1\)"),
        (np.ones(3), {"n_resamples": 0}, "n_resamples must be a positive int"),
    ],
)
def test_bad_inputs_raise(values: np.ndarray, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bootstrap_interval(values, **kwargs)


def test_paired_interval_needs_the_same_users() -> None:
    with pytest.raises(ValueError, match="same users in the same order, got 3 and 4"):
        paired_bootstrap_interval(np.ones(3), np.ones(4))


def test_ratio_interval_of_a_scaled_model_is_exactly_that_scale() -> None:
    b = np.random.default_rng(0).random(200) + 0.1
    # a = 1.5 b user by user: every paired resample has the same ratio
    assert paired_ratio_interval(1.5 * b, b) == pytest.approx((1.5, 1.5, 1.5))


def test_ratio_interval_contains_the_ratio_and_matches_a_numpy_bootstrap() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.random(300), rng.random(300)
    interval = paired_ratio_interval(a, b, confidence=0.9, n_resamples=20_000, seed=1)
    assert interval.mean == pytest.approx(a.mean() / b.mean())
    assert interval.low < interval.mean < interval.high
    users = np.random.default_rng(2).integers(0, 300, size=(20_000, 300))  # one draw for both
    ratios = a[users].mean(axis=1) / b[users].mean(axis=1)
    low, high = np.quantile(ratios, [0.05, 0.95])
    assert interval.low == pytest.approx(low, abs=5e-3)
    assert interval.high == pytest.approx(high, abs=5e-3)


def test_ratio_interval_needs_a_positive_reference() -> None:
    with pytest.raises(ValueError, match="mean\\(b\\) must be positive"):
        paired_ratio_interval(np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="same users in the same order"):
        paired_ratio_interval(np.ones(3), np.ones(4))


def _users_and_seeds(users_sd: float, seeds_sd: float, users: int = 20_000, seeds: int = 4):
    """Differences m_u + e_us: each user's own difference (sd ``users_sd``) plus seed noise."""
    rng = np.random.default_rng(7)
    own = rng.normal(0.01, users_sd, size=(users, 1))
    return own + rng.normal(0.0, seeds_sd, size=(users, seeds))


def test_seed_noise_finds_the_users_part_that_no_seed_removes() -> None:
    diffs = _users_and_seeds(users_sd=0.2, seeds_sd=0.3)
    noise = seed_noise(diffs)
    z, users = 1.959964, len(diffs)
    # what the generating spreads give: users' part alone, and with the 4 seeds' part on top
    assert noise.half_width_endless == pytest.approx(z * 0.2 / users**0.5, rel=0.05)
    assert noise.half_width == pytest.approx(
        z * (0.2**2 + 0.3**2 / 4) ** 0.5 / users**0.5, rel=0.05
    )
    assert noise.seeds == 4


def test_seed_noise_without_seed_noise_cannot_shrink_and_without_user_spread_can_vanish() -> None:
    same_every_seed = np.repeat(_users_and_seeds(0.2, 0.0, seeds=1), 3, axis=1)
    noise = seed_noise(same_every_seed)
    assert noise.half_width_endless == pytest.approx(noise.half_width, rel=1e-12)
    only_seeds = _users_and_seeds(users_sd=0.0, seeds_sd=0.3)
    noise = seed_noise(only_seeds)
    # 0 in expectation; its estimate, a difference of two variances, keeps ~(2 / users)^(1/4)
    assert noise.half_width_endless < 0.25 * noise.half_width


def test_seed_noise_with_these_seeds_matches_the_paired_bootstrap_of_the_seed_means() -> None:
    diffs = _users_and_seeds(users_sd=0.05, seeds_sd=0.1, users=2_000, seeds=3)
    ci = paired_bootstrap_interval(diffs.mean(axis=1), np.zeros(len(diffs)), n_resamples=2000)
    assert seed_noise(diffs).half_width == pytest.approx((ci.high - ci.low) / 2, rel=0.1)


@pytest.mark.parametrize(
    ("diffs", "match"),
    [
        (np.ones(5), "users x seeds"),
        (np.ones((5, 1)), "two or more seeds"),
        (np.ones((1, 3)), "at least 2 of each"),
        (np.array([[0.1, np.nan], [0.2, 0.3]]), "finite"),
    ],
)
def test_seed_noise_refuses_what_it_cannot_split(diffs: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        seed_noise(diffs)


def test_groups_of_one_row_each_change_nothing() -> None:
    values = np.random.default_rng(0).random(300)
    users = np.array([f"u{i}" for i in range(300)])
    assert bootstrap_interval(values, groups=users, seed=3) == bootstrap_interval(values, seed=3)


def test_groups_resample_users_with_all_their_rows() -> None:
    # 40 users with 25 rows each; a user's rows are all hits or all misses. Resampling rows
    # treats the 1,000 rows as independent; resampling users sees only 40 draws.
    rng = np.random.default_rng(0)
    hits = rng.random(40) < 0.5
    values = np.repeat(hits.astype(float), 25)
    users = np.repeat(np.arange(40), 25)
    rows = bootstrap_interval(values, n_resamples=4000)
    grouped = bootstrap_interval(values, groups=users, n_resamples=4000)
    assert grouped.mean == rows.mean == pytest.approx(hits.mean())
    # width ~ sqrt(p (1 - p) / n): 25x fewer draws, ~5x wider
    assert 4 < (grouped.high - grouped.low) / (rows.high - rows.low) < 6
    # and it is the interval of the 40 users' own means
    alone = bootstrap_interval(hits.astype(float), n_resamples=4000)
    assert grouped.high - grouped.low == pytest.approx(alone.high - alone.low, rel=0.15)


def test_grouped_mean_weighs_every_row() -> None:
    # user a: 3 rows of 1; user b: 1 row of 0 -> row mean 0.75 (not the users' mean 0.5)
    interval = paired_bootstrap_interval(
        np.array([1.0, 1.0, 1.0, 0.0]), np.zeros(4), groups=np.array(["a", "a", "a", "b"])
    )
    assert interval.mean == pytest.approx(0.75)
    assert 0.0 <= interval.low <= interval.mean <= interval.high <= 1.0


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        (np.array(["a", "b"]), "one user per row, got 2 labels for 3 rows"),
        (np.array(["a", "a", "a"]), "all 3 rows belong to one user"),
        (np.array(["a", None, "b"], dtype=object), "missing labels"),
    ],
)
def test_bad_groups_raise(groups: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bootstrap_interval(np.array([0.1, 0.2, 0.3]), groups=groups)


def test_ratio_interval_refuses_resamples_without_a_reference_score() -> None:
    # b scores for one user of 5: about a third of the resamples miss that user entirely
    b = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="b scores above 0 for 1 of 5 users"):
        paired_ratio_interval(np.ones(5), b)
