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
