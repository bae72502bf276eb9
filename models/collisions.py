"""Make every SID unique while keeping all SIDs the same length.

1. Within each group of items that share the first L−1 codes, colliding items are moved to
   free last-level codes by a capacity-constrained assignment (each code holds one item of
   the group; Hungarian algorithm on the distance of each item's last-level residual to each
   codeword, so items move to their nearest free codes). In every clash the item closest to
   the contested code keeps it.
2. Items that still collide (a prefix group larger than the codebook, or no residuals, as
   for an imported map) get an extra disambiguation level appended to *every* SID: the
   item's index within its SID group (0 for unique SIDs, fixed items first), as in TIGER.
   Items beyond the K indices of their SID (more than K identical SIDs, e.g. duplicate
   texts) move to the free (last code, index) pairs of their prefix group, nearest free
   last code first (the closest claimant keeps a contested code): a prefix group holds up to
   K·K items. Only a larger group is an error (``CatalogTooLarge``, naming the prefix).

Items listed in ``fixed`` (incremental mode) never change their codes. Where the map they
come from has an extra level already (``held``: their indices on it), step 1 is skipped and
every other item takes the lowest index its SID has free, then, past K, a free pair of its
prefix group as above: full builds and incremental extensions place items by the same code.
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
    """Items moved to another last-level code (by step 1 or by the extra level)."""
    extra_level: bool


class CatalogTooLarge(ValueError):
    """The codebook configuration cannot give every item a distinct SID."""


def resolve_collisions(
    codes: np.ndarray,
    *,
    codebook_size: int,
    last_level_costs: CostFn | None,
    fixed: np.ndarray | None = None,
    held: np.ndarray | None = None,
    allow_extra_level: bool = True,
) -> Resolution:
    """``held``: the fixed rows' indices on an extra level their map already has (other rows'
    values are ignored); the result then always has the extra level."""
    given = np.asarray(codes)
    codes = np.array(given, dtype=np.int64, copy=True)
    fixed = np.zeros(len(codes), dtype=bool) if fixed is None else np.asarray(fixed, dtype=bool)
    if held is not None:
        held = np.where(fixed, np.asarray(held, dtype=np.int64), 0)
        assert held.max(initial=0) < codebook_size, "held indices must be below codebook_size"
    reassigned = 0
    if last_level_costs is not None and held is None:
        reassigned = _reassign_last_level(codes, codebook_size, last_level_costs, fixed)
    groups = _group_ids(codes)
    if held is None and len(np.unique(groups)) == len(codes):
        return Resolution(codes, reassigned, extra_level=False)
    if not allow_extra_level:
        raise CatalogTooLarge("SIDs still collide and an extra level is not allowed")
    extra, spread = _extra_level(codes, groups, given, codebook_size, last_level_costs, fixed, held)
    return Resolution(np.column_stack([codes, extra]), reassigned + spread, extra_level=True)


def _group_ids(codes: np.ndarray) -> np.ndarray:
    return np.unique(codes, axis=0, return_inverse=True)[1].reshape(-1)


def _prefix_ids(codes: np.ndarray) -> np.ndarray:
    """Group ids of the first L−1 codes (one group when there is one level)."""
    if codes.shape[1] == 1:
        return np.zeros(len(codes), dtype=np.int64)
    return _group_ids(codes[:, :-1])


def _rank_in_runs(sorted_keys: np.ndarray) -> np.ndarray:
    """Each position's index within its run of equal keys."""
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_keys)) + 1]
    return np.arange(len(sorted_keys)) - np.repeat(starts, np.diff(np.r_[starts, len(sorted_keys)]))


def _reassign_last_level(codes: np.ndarray, k: int, costs: CostFn, fixed: np.ndarray) -> int:
    prefix_ids = _prefix_ids(codes)
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


def _extra_level(
    codes: np.ndarray,
    groups: np.ndarray,
    given: np.ndarray,
    k: int,
    costs: CostFn | None,
    fixed: np.ndarray,
    held: np.ndarray | None,
) -> tuple[np.ndarray, int]:
    """The extra level's index of every item, and how many items moved to another last code.

    Each item's index within its SID group (``_indices``), as in TIGER; items past the k
    indices of their SID (moves ``codes`` in place) spread over their prefix group's free
    (last code, index) pairs."""
    extra = _indices(groups, fixed, held)
    overflow = np.flatnonzero(extra >= k)
    if fixed[overflow].any():
        row = overflow[fixed[overflow]][0]
        n = int(((groups == groups[row]) & fixed).sum())
        raise CatalogTooLarge(
            f"{n} items that keep their SID share {tuple(codes[row].tolist())}, more than the "
            f"{k} indices of an extra level"
        )
    if len(overflow):
        _spread(codes, extra, overflow, given, k, costs)
    log.info(
        "appended a disambiguation level (largest SID group: %d items, %d moved to free codes)",
        int(np.bincount(groups).max()),
        len(overflow),
    )
    return extra, len(overflow)


def _indices(groups: np.ndarray, fixed: np.ndarray, held: np.ndarray | None) -> np.ndarray:
    """Each item's index within its SID group (``groups``), possibly k or more. Fixed items
    keep their ``held`` index or, without one, come first (0, 1, … in row order); the others
    take, in row order, the lowest indices that no fixed item of their SID holds."""
    order = np.lexsort((~fixed, groups))
    extra = np.empty(len(groups), dtype=np.int64)
    extra[order] = _rank_in_runs(groups[order])
    if held is None:
        return extra
    # a free item's rank r among its SID's free items, and its SID's held indices u_0 < u_1 <
    # …: the r-th index no u takes is r + #{j : u_j - j <= r} (u_j - j indices are free below u_j)
    rank = extra - np.bincount(groups[fixed], minlength=groups.max() + 1)[groups]
    by_held = np.lexsort((held[fixed], groups[fixed]))
    g, u = groups[fixed][by_held], held[fixed][by_held]
    span = len(groups) + int(held.max()) + 1  # above every r and every u_j - j
    keys = g * span + (u - _rank_in_runs(g))
    free = ~fixed
    below = np.searchsorted(keys, groups[free] * span + rank[free], side="right")
    extra[free] = rank[free] + below - np.searchsorted(keys, groups[free] * span)
    extra[fixed] = held[fixed]
    return extra


def _spread(
    codes: np.ndarray,
    extra: np.ndarray,
    overflow: np.ndarray,
    given: np.ndarray,
    k: int,
    costs: CostFn | None,
) -> None:
    """Move the ``overflow`` items to free (last code, index) pairs of their own prefix group,
    nearest last code first (by ``costs``; without them, the lowest free code), the lowest free
    index of that code; a Python loop over the overflowing prefix groups only."""
    assert codes[:, -1].max() < k, "last-level codes must be below codebook_size"
    prefix = _prefix_ids(codes)
    order = np.argsort(prefix, kind="stable")
    sorted_prefix = prefix[order]
    for p in np.unique(prefix[overflow]):
        lo, hi = np.searchsorted(sorted_prefix, [p, p + 1])
        members = order[lo:hi]  # row order
        movers = members[extra[members] >= k]
        if len(members) > k * k:
            raise _too_large(given[members], k)
        staying = members[extra[members] < k]
        taken = np.zeros((k, k), dtype=bool)  # (last code, index) pairs held by staying items
        taken[codes[staying, -1], extra[staying]] = True
        cost = (
            _costs_in_chunks(costs, movers)
            if costs is not None
            else np.zeros((len(movers), k), dtype=np.float64)
        )
        last = _nearest_with_room(cost, k - taken.sum(axis=1))
        free = np.argsort(taken, axis=1, kind="stable")  # per code: its free indices, lowest first
        by_code = np.argsort(last, kind="stable")
        codes[movers, -1] = last
        extra[movers[by_code]] = free[last[by_code], _rank_in_runs(last[by_code])]


def _nearest_with_room(cost: np.ndarray, room: np.ndarray) -> np.ndarray:
    """A code for every row, each code taking at most ``room`` rows: in rounds, every row left
    claims its nearest code with room, and a code short of room takes its closest claimants
    (the earlier row on a tie). Each round places at least one row per claimed code."""
    assert len(cost) <= room.sum()
    room = room.copy()
    prefs = np.argsort(cost, axis=1, kind="stable")  # each row's codes, nearest first
    at = np.zeros(len(cost), dtype=np.int64)  # the row's current claim: prefs[row, at[row]]
    chosen = np.full(len(cost), -1, dtype=np.int64)
    left = np.arange(len(cost))
    while left.size:
        want = prefs[left, at[left]]
        while (full := room[want] == 0).any():  # a full code never reopens: skip it for good
            at[left[full]] += 1
            want[full] = prefs[left[full], at[left[full]]]
        ranked = np.lexsort((left, cost[left, want], want))  # by code, closest first
        wanted = want[ranked]
        won = _rank_in_runs(wanted) < room[wanted]
        chosen[left[ranked[won]]] = wanted[won]
        room -= np.bincount(wanted[won], minlength=len(room))
        left = left[chosen[left] < 0]
    return chosen


def _too_large(group: np.ndarray, k: int) -> CatalogTooLarge:
    """The error for a prefix group (its items' codes as given) beyond the k·k SIDs an extra
    level gives it, saying whether identical items are the cause."""
    n, levels = group.shape
    prefix = tuple(group[0, :-1].tolist())
    where = f"share the SID prefix {prefix}" if levels > 1 else "have one-level SIDs"
    same = int(np.unique(group, axis=0, return_counts=True)[1].max())
    message = (
        f"{n} items {where}: more than the {k}x{k} = {k * k} (last code, extra index) pairs "
        "an extra level gives them"
    )
    if same > k * k:  # the duplicates alone overflow: only fewer of them, or a larger k, fit
        which = "all of them" if same == n else f"{same} of them"
        return CatalogTooLarge(
            f"{message}; {which} have identical codes at every level, i.e. (near-)identical "
            "embeddings such as duplicate texts: de-duplicate the catalog or use "
            "sids.embedding=hybrid (collaborative factors tell such items apart); a larger "
            "sids.codebook_size also helps, more sids.levels does not separate identical "
            "embeddings"
        )
    # (n > k·k items on k last codes: some SID always holds more than k of them)
    return CatalogTooLarge(
        f"{message}; increase sids.codebook_size or sids.levels ({same} of them have identical "
        "codes at every level: if they are duplicate texts, de-duplicating the catalog or "
        "sids.embedding=hybrid helps too)"
    )
