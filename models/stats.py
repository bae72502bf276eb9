"""Bootstrap confidence intervals for per-user metrics, alone and as paired differences.

A test set of a few hundred users gives an HR@10 whose noise is easily as large as the
difference between two models. Intervals are computed over users (rows of
``models.metrics.per_row_metrics``): the percentile bootstrap of the mean, via
``scipy.stats.bootstrap``. Comparing two models on the *same* users should use the paired
interval: per-user difficulty is shared by both models and cancels in the difference, so a
real gap shows up even when the two unpaired intervals overlap.

Where a user has several rows (a sliding-window split scores every later interaction), the
rows are not independent: ``groups`` names each row's user and the bootstrap then resamples
users with all their rows (a cluster bootstrap of the row mean), so such a user counts as one
draw, not as many.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

MAX_RESAMPLED_VALUES = 1 << 22
"""Resampled values held at once (a batch of resamples × users), ~32 MiB of float64: bounds
memory on large test sets without changing the result, which depends on the seed only."""


class Interval(NamedTuple):
    """A point estimate and its bootstrap confidence interval."""

    mean: float
    """Mean over all rows (the statistic on the observed data, not the bootstrap mean)."""
    low: float
    high: float


def bootstrap_interval(
    values: np.ndarray,
    *,
    groups: np.ndarray | None = None,
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Interval:
    """Percentile-bootstrap interval of ``values.mean()``, resampling rows (users).

    ``values`` holds one score per row (e.g. ``per_row_metrics(...)["hr@10"]``). ``groups``
    (optional, one label per row: the row's user) makes the users the resampled unit where a
    user has several rows; with one row per user it changes nothing. The same ``seed`` gives
    the same interval, so reported intervals can be reproduced.
    """
    values = _validate_values(values, "values")
    clusters = _clusters(values, groups)
    if clusters is None:
        low, high = _percentile_bootstrap((values,), np.mean, confidence, n_resamples, seed)
    else:
        low, high = _percentile_bootstrap(clusters, _pooled_mean, confidence, n_resamples, seed)
    return Interval(float(values.mean()), low, high)


def paired_bootstrap_interval(
    a: np.ndarray,
    b: np.ndarray,
    *,
    groups: np.ndarray | None = None,
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Interval:
    """Interval of ``mean(a - b)`` with the same users resampled for both models.

    ``a[i]`` and ``b[i]`` must score the same row ``i`` (``groups[i]``: its user, as in
    ``bootstrap_interval``). Resampling users jointly and taking ``mean(a*) - mean(b*)``
    equals ``mean((a - b)*)``, so this is the bootstrap of the per-user differences. An
    interval that excludes 0 means ``a`` and ``b`` differ.
    """
    a, b = _validate_pair(a, b)
    return bootstrap_interval(
        a - b, groups=groups, confidence=confidence, n_resamples=n_resamples, seed=seed
    )


def paired_ratio_interval(
    a: np.ndarray,
    b: np.ndarray,
    *,
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Interval:
    """Interval of ``mean(a) / mean(b)`` with the same users resampled for both models.

    ``a[i]`` and ``b[i]`` must score the same user ``i``; each bootstrap replicate draws one
    resample of users and takes the ratio of the two means on it (percentile bootstrap). For
    "model A reaches x times model B" targets; an interval above 1 means A beats B.
    """
    a, b = _validate_pair(a, b)
    if b.mean() <= 0:
        raise ValueError(
            f"mean(b) must be positive for a ratio, got {b.mean()!r}; b is the reference model"
        )

    def ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.asarray(x.mean(axis=axis) / y.mean(axis=axis))

    with np.errstate(divide="ignore", invalid="ignore"):  # a resample where b is all 0
        low, high = _percentile_bootstrap((a, b), ratio, confidence, n_resamples, seed)
    if not (np.isfinite(low) and np.isfinite(high)):
        raise ValueError(
            f"the ratio's interval is unbounded: b scores above 0 for {int((b > 0).sum())} of "
            f"{len(b)} users, so some resamples hold none of them; compare on more users or "
            "report the paired difference (paired_bootstrap_interval) instead"
        )
    return Interval(float(a.mean() / b.mean()), low, high)


class SeedNoise(NamedTuple):
    """How wide the interval of a mean difference over users is with the seeds run, and how
    wide it would stay with endless seeds (normal approximation)."""

    seeds: int
    half_width: float
    """Half-width of the interval of the mean difference with these seeds."""
    half_width_endless: float
    """The same as the seeds grow without end: the users' own spread, which no seed removes
    (0 when the seeds explain all of it)."""


def seed_noise(diffs: np.ndarray, *, confidence: float = 0.95) -> SeedNoise:
    """Split the noise of a mean per-user difference into its users' and its seeds' part.

    ``diffs[u, s]`` is user ``u``'s score difference (B - A) in seed ``s``; every seed scores
    the same users. With ``d_us = m_u + e_us`` (``m_u`` the user's difference over endless
    seeds, ``e_us`` its seed noise of variance ``v_u``), the users' variance of the seed mean
    is ``Var(m) + mean(v) / S``; each user's variance over the seeds estimates ``v_u``, so
    ``Var(m)`` is what remains. The mean difference's standard error is ``sqrt(Var / users)``
    with and without the seed term; the half-widths are ``z`` times those. The paired bootstrap
    interval of the seed means (``paired_bootstrap_interval``) measures the first; this one
    says how far more seeds could narrow it."""
    diffs = np.asarray(diffs)
    if diffs.ndim != 2 or diffs.shape[0] < 2 or diffs.shape[1] < 2:
        raise ValueError(
            "diffs must be a 2-D array of users x seeds with at least 2 of each, got shape "
            f"{diffs.shape}: run the comparison on two or more seeds"
        )
    diffs = _finite_numbers(diffs, "diffs")
    _validate_options(confidence, 1)
    users, seeds = diffs.shape
    total = float(np.var(diffs.mean(axis=1), ddof=1))
    within = float(np.var(diffs, axis=1, ddof=1).mean())
    users_part = max(0.0, total - within / seeds)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    return SeedNoise(seeds, z * (total / users) ** 0.5, z * (users_part / users) ** 0.5)


def _percentile_bootstrap(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., np.ndarray],
    confidence: float,
    n_resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``statistic(*data)``, the arrays' rows (users)
    resampled together."""
    _validate_options(confidence, n_resamples)
    result = stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        batch=max(1, MAX_RESAMPLED_VALUES // (len(data) * len(data[0]))),
        vectorized=True,
        paired=True,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return float(ci.low), float(ci.high)


def _clusters(
    values: np.ndarray, groups: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per group, the sum of its rows' values and its row count (groups in order of first
    appearance); None when there are no groups or every row is its own group."""
    if groups is None:
        return None
    groups = np.asarray(groups)
    if groups.shape != values.shape:
        raise ValueError(
            f"groups must name one user per row, got {len(groups)} labels for {len(values)} rows"
        )
    codes = pd.factorize(groups)[0]
    if (codes < 0).any():
        raise ValueError("groups must not hold missing labels: every row needs its user")
    counts = np.bincount(codes)
    if len(counts) == len(values):
        return None
    if len(counts) < 2:
        raise ValueError(
            f"all {len(values)} rows belong to one user: a bootstrap over users needs at least 2"
        )
    return np.bincount(codes, weights=values), counts.astype(np.float64)


def _pooled_mean(sums: np.ndarray, counts: np.ndarray, axis: int = -1) -> np.ndarray:
    """Row mean of a resample of groups: their summed values over their summed rows."""
    return np.asarray(sums.sum(axis=axis) / counts.sum(axis=axis))


def _validate_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = _validate_values(a, "a"), _validate_values(b, "b")
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must score the same users in the same order, got {len(a)} and {len(b)} "
            "values; evaluate both models on one test set"
        )
    return a, b


def _validate_values(values: np.ndarray, name: str) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, one value per user, got {values.shape}")
    if len(values) < 2:
        raise ValueError(
            f"{name} has {len(values)} value(s): a bootstrap over users needs at least 2; "
            "evaluate on more users (is the test set empty?)"
        )
    return _finite_numbers(values, name)


def _finite_numbers(values: np.ndarray, name: str) -> np.ndarray:
    """``values`` as float64, refused unless every value is a finite number (or a bool)."""
    numeric = np.issubdtype(values.dtype, np.number) or values.dtype == np.bool_
    if not numeric or not np.isfinite(values).all():
        raise ValueError(f"{name} must hold finite numbers, got dtype {values.dtype} or NaN/inf")
    return values.astype(np.float64)


def _validate_options(confidence: float, n_resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), e.g. 0.95, got {confidence!r}")
    if not isinstance(n_resamples, int | np.integer) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive int, got {n_resamples!r}")
