"""Make every SID unique while keeping all SIDs the same length.

1. Within each group of items that share the first L−1 codes, colliding items are moved to
   free last-level codes by a capacity-constrained assignment (each code holds one item of
   the group; Hungarian algorithm on the distance of each item's last-level residual to each
   codeword, so items move to their nearest free codes). In every clash the item closest to
   the contested code keeps it.
2. Items that still collide (a prefix group larger than the codebook, or no residuals, as
   for an imported map) get an extra disambiguation level appended to *every* SID: the
   item's index within its SID group (0 for unique SIDs), as in TIGER.

Items listed in ``fixed`` (incremental mode) never change their codes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

log = logging.getLogger(__name__)

CostFn = Callable[[np.ndarray], np.ndarray]
"""item indices → (len(indices), K) distances of their last-level residuals to every codeword."""


class Resolution(NamedTuple):
    codes: np.ndarray
    """(items × levels) or (items × levels+1) when ``extra_level``."""
    reassigned: int
    """Items moved to another last-level code."""
    extra_level: bool


class CatalogTooLarge(ValueError):
    """The codebook configuration cannot give every item a distinct SID."""


def resolve_collisions(
    codes: np.ndarray,
    *,
    codebook_size: int,
    last_level_costs: CostFn | None,
    fixed: np.ndarray | None = None,
    allow_extra_level: bool = True,
) -> Resolution:
    codes = np.array(codes, dtype=np.int64, copy=True)
    fixed = np.zeros(len(codes), dtype=bool) if fixed is None else np.asarray(fixed, dtype=bool)
    reassigned = 0
    if last_level_costs is not None:
        reassigned = _reassign_last_level(codes, codebook_size, last_level_costs, fixed)
    groups = _group_ids(codes)
    if len(np.unique(groups)) == len(codes):
        return Resolution(codes, reassigned, extra_level=False)
    if not allow_extra_level:
        raise CatalogTooLarge("SIDs still collide and an extra level is not allowed")
    return Resolution(_append_level(codes, groups, codebook_size), reassigned, extra_level=True)


def _group_ids(codes: np.ndarray) -> np.ndarray:
    return np.unique(codes, axis=0, return_inverse=True)[1].reshape(-1)


def _reassign_last_level(codes: np.ndarray, k: int, costs: CostFn, fixed: np.ndarray) -> int:
    prefix_ids = (
        _group_ids(codes[:, :-1]) if codes.shape[1] > 1 else np.zeros(len(codes), dtype=np.int64)
    )
    # items of a prefix group in row order; a group collides when two share a last code
    order = np.argsort(prefix_ids, kind="stable")
    group, last = prefix_ids[order], codes[order, -1]
    by_code = np.lexsort((last, group))  # stable: row order within (group, code)
    repeats = (np.diff(group[by_code]) == 0) & (np.diff(last[by_code]) == 0)
    colliding = np.zeros(group[-1] + 1 if len(group) else 0, dtype=bool)
    colliding[group[by_code][1:][repeats]] = True
    members = order[colliding[group]]  # the colliding groups' items, group by group
    if len(members) == 0:
        return 0
    cost = _costs_in_chunks(costs, members)
    kept = _kept(prefix_ids[members], codes[members, -1], cost, fixed[members])
    bounds = np.flatnonzero(np.diff(prefix_ids[members])) + 1
    moved = 0
    for rows in np.split(np.arange(len(members)), bounds):
        moved += _move_group(codes, members[rows], cost[rows], kept[rows], k)
    return moved


def _costs_in_chunks(costs: CostFn, rows: np.ndarray, chunk: int = 1 << 15) -> np.ndarray:
    """``costs(rows)``, a chunk of rows per call: a call per colliding group (for RQ-VAE a
    forward pass each) took most of the sids stage at 10^5 items (bench/scale.py)."""
    return np.concatenate([costs(rows[lo : lo + chunk]) for lo in range(0, len(rows), chunk)])


def _kept(group: np.ndarray, last: np.ndarray, cost: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """Which items keep their last code: fixed items, and for each contested code of a group
    without a fixed holder, the item closest to it (the earlier row on a tie)."""
    own = cost[np.arange(len(last)), last]
    ranked = np.lexsort((own, ~fixed, last, group))  # fixed first, then closest
    first = np.ones(len(ranked), dtype=bool)
    first[1:] = (np.diff(group[ranked]) != 0) | (np.diff(last[ranked]) != 0)
    kept = np.zeros(len(last), dtype=bool)
    kept[ranked] = first | fixed[ranked]
    return kept


def _move_group(
    codes: np.ndarray, members: np.ndarray, cost: np.ndarray, kept: np.ndarray, k: int
) -> int:
    """Move a group's items that lost their code to free last-level codes, nearest first
    (Hungarian algorithm); returns how many moved."""
    taken = np.zeros(k, dtype=bool)
    taken[codes[members[kept], -1]] = True
    movers = np.flatnonzero(~kept)
    free = np.flatnonzero(~taken)
    if len(movers) == 0 or len(free) == 0:
        return 0
    sub = cost[np.ix_(movers, free)]
    rows, cols = linear_sum_assignment(
        sub
    )  # len(rows) = min(movers, free): overflow stays colliding
    codes[members[movers[rows]], -1] = free[cols]
    return len(rows)


def _append_level(codes: np.ndarray, groups: np.ndarray, k: int) -> np.ndarray:
    order = np.argsort(groups, kind="stable")
    rank = np.empty(len(codes), dtype=np.int64)
    sorted_groups = groups[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_groups)) + 1]
    first_of_group = np.repeat(starts, np.diff(np.r_[starts, len(codes)]))
    rank[order] = np.arange(len(codes)) - first_of_group
    if rank.max() >= k:
        raise CatalogTooLarge(
            f"{rank.max() + 1} items share one SID, more than the {k} codes of the extra level; "
            "increase sids.codebook_size or sids.levels"
        )
    log.info("appended a disambiguation level (largest group: %d items)", rank.max() + 1)
    return np.column_stack([codes, rank])
