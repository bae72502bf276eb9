"""Drift between two loads of the interaction log: how the data a retrain sees changed since
the last accepted load — sizes, new and vanished users and items, the shape of user activity
and of item popularity, the time range.

A load is kept as a :class:`LoadProfile` (interactions per user and per catalog item, its time
range and a content hash): that is all the next comparison needs, and the raw tables it came
from are replaced by the next ingest.

Distributions are compared by shape, not by level: the later load's counts are first brought
to the earlier load's level (multiplied by the ratio of the two loads' typical counts) and
rounded to whole interactions. A log that grows evenly (every user and item gaining the same
share) is then not drift; ``level`` (the ratio) and the sizes show the growth. The typical
count is the 10% trimmed mean (``scipy.stats.trim_mean``; the plain mean where that is 0): a
few bots, blockbusters or new cold items barely move it, so they show as what they are (a few
counts at the top, a few zeros) rather than as every other count shifting. The rounding keeps
counts on the whole numbers they live on: a level change smaller than half an interaction
leaves a count where it was, so tied counts stay tied instead of each one landing a hair away
from its earlier value (which would read as a shift of the whole tie group).

Each shape is compared with two effect sizes (with 10^5 users any difference is
"significant", so no p-values):

- the population stability index (PSI): both loads binned on the earlier load's deciles,
  ``sum((a - b) * ln(a / b))`` over the bins' shares ``b`` (before) and ``a`` (after); 0 for
  the same distribution, above 0.1 usually read as a moderate shift, above 0.25 as a major
  one. PSI flags drift. Counts tie in large groups (thousands of items with one interaction),
  and a decile usually falls on such a group, so each edge is moved to the midpoint between
  the earlier load's values around it: a group of tied counts is never cut by an edge and one
  more user or item cannot carry a whole group into the next bin.
- the two-sample Kolmogorov–Smirnov statistic (``scipy.stats.ks_2samp``): the largest gap
  between the two empirical CDFs over all values of both loads (no binning, ties counted
  whole), reported beside it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from sidrec.errors import InputError
from sidrec.io import AtomicOutputs, read_json, read_table
from sidrec.schemas import LOAD_PROFILE

DISTRIBUTIONS = {"interactions_per_user": "users", "interactions_per_item": "items"}
"""The distributions compared: report name → :class:`LoadProfile` field."""
PSI_BINS = 10
PSI_FLOOR = 1e-4
"""Smallest share a bin counts with, so a bin one load leaves empty adds a large, finite term."""
LEVEL_TRIM = 0.1
"""Share of the smallest and of the largest counts a load's level leaves out."""
TOP_K = 100
EXAMPLES = 5
"""New and vanished ids listed in the report (the counts are complete)."""


class LoadProfile(NamedTuple):
    """What one load looked like, as validation accepted it."""

    load_id: str
    """Content hash of the load's raw tables: validating the same load twice gives one id."""
    users: pd.Series
    """Interactions per user (index: user id), after the minimum-activity filter."""
    items: pd.Series
    """Interactions per catalog item (index: item id), 0 for items nobody interacted with."""
    time_range: tuple[int, int, int]
    """Earliest, median and latest interaction (Unix seconds)."""

    def summary(self) -> dict[str, Any]:
        first, median, last = self.time_range
        return {
            "load_id": self.load_id,
            "interactions": int(self.users.sum()),
            "users": len(self.users),
            "items": len(self.items),
            "time_first": first,
            "time_median": median,
            "time_last": last,
        }


def profile_load(interactions: pd.DataFrame, items: pd.DataFrame, *, load_id: str) -> LoadProfile:
    """The profile of validated ``interactions`` (user_id, item_id, timestamp) over the catalog
    ``items`` (item_id)."""
    assert len(interactions), "validation leaves at least one interaction"
    users = interactions["user_id"].astype(str).value_counts()
    catalog = pd.Index(items["item_id"].astype(str))
    per_item = interactions["item_id"].astype(str).value_counts().reindex(catalog, fill_value=0)
    times = interactions["timestamp"].to_numpy(dtype=np.int64)
    return LoadProfile(
        load_id=load_id,
        users=_counts(users),
        items=_counts(per_item),
        time_range=(int(times.min()), int(np.median(times)), int(times.max())),
    )


def _counts(series: pd.Series) -> pd.Series:
    """Counts by id, sorted by id (one order, whatever the source's)."""
    index = pd.Index(series.index.astype(str), name="id")
    out = pd.Series(series.to_numpy(dtype=np.int64), index=index, name="interactions")
    return out.sort_index()


# ---------------------------------------------------------------- comparing two loads


def compare_loads(
    before: LoadProfile | None, after: LoadProfile, *, psi_threshold: float
) -> dict[str, Any]:
    """The drift report of ``after`` against ``before`` (None: the first load, nothing to
    compare). ``status`` is ``first load``, ``no drift`` or ``drift``; ``flagged`` names the
    distributions whose PSI exceeds ``psi_threshold``."""
    report: dict[str, Any] = {
        "status": "first load",
        "flagged": [],
        "psi_threshold": psi_threshold,
        "load": after.summary(),
        "baseline": None,
    }
    if before is None:
        report["note"] = "no earlier load to compare with; the next load is compared with this one"
        return report
    distributions = {
        name: compare_distributions(getattr(before, field), getattr(after, field), psi_threshold)
        for name, field in DISTRIBUTIONS.items()
    }
    flagged = [name for name, d in distributions.items() if d["drift"]]
    b, a = before.summary(), after.summary()
    report.update(
        status="drift" if flagged else "no drift",
        flagged=flagged,
        baseline=b,
        sizes={
            key: {"before": b[key], "after": a[key], "change": a[key] / b[key] - 1}
            for key in ("interactions", "users", "items")
        },
        users=membership(before.users.index, after.users.index),
        items=membership(before.items.index, after.items.index),
        distributions=distributions,
        top_items=top_items_kept(before.items, after.items),
    )
    return report


def psi(before: np.ndarray, after: np.ndarray, bins: int = PSI_BINS) -> float:
    """Population stability index of ``after`` against ``before``, both binned on ``before``'s
    quantiles, each moved up to the midpoint between ``before``'s largest value at or below it
    and the next larger one, so no value of ``before`` lies on an edge (a quantile at
    ``before``'s maximum stays: its last bin holds what exceeds anything ``before`` had).
    Tied quantiles merge."""
    distinct = np.unique(before)
    quantile = np.quantile(before, np.linspace(0, 1, bins + 1)[1:-1])
    above = np.searchsorted(distinct, quantile, side="right")  # the next larger value's index
    midpoint = (distinct[above - 1] + distinct[np.minimum(above, len(distinct) - 1)]) / 2
    edges = np.unique(np.where(above < len(distinct), midpoint, quantile))

    def shares(values: np.ndarray) -> np.ndarray:
        # bin i holds edges[i-1] < x <= edges[i]; the last bin everything above the last edge
        counts = np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(edges) + 1)
        return np.maximum(counts / len(values), PSI_FLOOR)

    b, a = shares(before), shares(after)
    return float(np.sum((a - b) * np.log(a / b)))


def level(counts: np.ndarray) -> float:
    """The typical count: the trimmed mean of ``counts`` (:data:`LEVEL_TRIM` cut at each end);
    the plain mean where that is 0 (a catalog mostly without interactions)."""
    from scipy.stats import trim_mean

    return float(trim_mean(counts, LEVEL_TRIM)) or float(counts.mean())


def compare_distributions(
    before: pd.Series, after: pd.Series, psi_threshold: float
) -> dict[str, Any]:
    """PSI and the KS statistic of the shapes of two count distributions (``after`` brought to
    ``before``'s level, in whole interactions), the level ratio, their raw quantiles, and
    whether PSI flags drift."""
    from scipy.stats import ks_2samp

    b, a = (s.to_numpy(dtype=np.float64) for s in (before, after))
    typical = level(b)
    ratio = level(a) / typical if typical > 0 else 1.0  # an earlier load without interactions
    a = np.round(a / ratio)
    value = psi(b, a)
    return {
        "psi": round(value, 4),
        "ks": round(float(ks_2samp(b, a, method="asymp").statistic), 4),
        "level": round(ratio, 4),
        "drift": value > psi_threshold,
        "before": quantiles(before),
        "after": quantiles(after),
    }


def quantiles(counts: pd.Series) -> dict[str, float]:
    """Mean, median, 90th and 99th percentile and maximum of raw counts (two decimals)."""
    values = counts.to_numpy(dtype=np.float64)
    q50, q90, q99 = np.quantile(values, [0.5, 0.9, 0.99])
    return {
        name: round(float(v), 2)
        for name, v in zip(
            ("mean", "p50", "p90", "p99", "max"),
            (values.mean(), q50, q90, q99, values.max()),
            strict=True,
        )
    }


def membership(before: pd.Index, after: pd.Index) -> dict[str, Any]:
    """Ids new in ``after`` and ids of ``before`` that vanished, counted and exemplified."""
    new, vanished = after.difference(before), before.difference(after)
    return {
        "new": len(new),
        "vanished": len(vanished),
        "new_share": len(new) / len(after),
        "vanished_share": len(vanished) / len(before),
        "new_examples": [str(i) for i in new[:EXAMPLES]],
        "vanished_examples": [str(i) for i in vanished[:EXAMPLES]],
    }


def top_items_kept(before: pd.Series, after: pd.Series, k: int = TOP_K) -> dict[str, Any]:
    """The share of the earlier load's ``k`` most popular items still among the ``k`` most
    popular (ties broken by id)."""
    k = min(k, len(before), len(after))

    def top(counts: pd.Series) -> set[str]:
        return set(counts.sort_values(ascending=False, kind="stable").index[:k])

    return {"k": k, "kept": len(top(before) & top(after)) / k}


# ---------------------------------------------------------------- reading the report


def drift_line(report: dict[str, Any]) -> str:
    """A few words for the run's summary table."""
    if report["status"] != "drift":
        return report["status"]
    psis = ", ".join(
        f"{name.replace('_', ' ')} PSI {report['distributions'][name]['psi']:.2f}"
        for name in report["flagged"]
    )
    return f"drift ({psis})"


def drift_markdown(report: dict[str, Any], dataset: str) -> str:
    """The report as a markdown table (Prefect artifact): the last load, this one, the change."""
    load = report["load"]
    if report["baseline"] is None:
        return (
            f"### Drift of `{dataset}`: first load\n\nNothing to compare with: load "
            f"`{load['load_id']}` ({load['interactions']:,} interactions, {load['users']:,} users, "
            f"{load['items']:,} items, {_dates(load)}) is the baseline of the next load.\n"
        )
    base, sizes = report["baseline"], report["sizes"]
    rows = [
        ("load", f"`{base['load_id']}`", f"`{load['load_id']}`", ""),
        *[
            (
                name if name != "items" else "catalog items",
                f"{sizes[name]['before']:,}",
                f"{sizes[name]['after']:,}",
                f"{sizes[name]['change']:+.1%}" + _membership_note(report.get(name)),
            )
            for name in ("interactions", "users", "items")
        ],
    ]
    for name, d in report["distributions"].items():
        verdict = " · **drift**" if d["drift"] else ""
        rows.append(
            (
                f"{name.replace('_', ' ')} (p50 / p90 / p99 / max)",
                _quantile_cell(d["before"]),
                _quantile_cell(d["after"]),
                f"PSI {d['psi']:.3f} · KS {d['ks']:.3f} · level ×{d['level']:.2f}{verdict}",
            )
        )
    top = report["top_items"]
    rows += [
        (f"top-{top['k']} items still in the top {top['k']}", "", "", f"{top['kept']:.0%}"),
        ("time range (UTC)", _dates(base), _dates(load), ""),
    ]
    table = "\n".join(f"| {' | '.join(row)} |" for row in rows)
    return (
        f"### Drift of `{dataset}` against the last load: {report['status']}\n\n"
        f"| | last load | this load | change |\n|---|---|---|---|\n{table}\n\n"
        f"A distribution is flagged when its PSI exceeds {report['psi_threshold']:g} "
        "(`validate.drift_psi`).\n"
    )


def _membership_note(members: dict[str, Any] | None) -> str:
    return "" if members is None else f" · {members['new']:,} new, {members['vanished']:,} vanished"


def _quantile_cell(q: dict[str, float]) -> str:
    return " / ".join(f"{q[k]:g}" for k in ("p50", "p90", "p99", "max"))


def _dates(summary: dict[str, Any]) -> str:
    day = [
        dt.datetime.fromtimestamp(summary[k], dt.UTC).date().isoformat()
        for k in ("time_first", "time_last")
    ]
    return f"{day[0]} – {day[1]}"


# ---------------------------------------------------------------- keeping profiles


def write_profiles(
    out: AtomicOutputs,
    *,
    profiles: Path,
    summaries: Path,
    current: LoadProfile,
    previous: LoadProfile | None,
) -> None:
    """Stage ``current`` and ``previous`` (the load ``current`` was compared with) in ``out``."""
    loads = {"current": current, "previous": previous}
    rows = [
        pd.DataFrame(
            {"load": load, "kind": kind, "id": counts.index, "interactions": counts.to_numpy()}
        )
        for load, profile in loads.items()
        if profile is not None
        for kind, counts in (("user", profile.users), ("item", profile.items))
    ]
    out.parquet(pd.concat(rows, ignore_index=True), profiles, LOAD_PROFILE)
    out.json({k: p.summary() if p else None for k, p in loads.items()}, summaries)


def read_profiles(
    *, profiles: Path, summaries: Path
) -> tuple[LoadProfile | None, LoadProfile | None]:
    """The kept (current, previous) profiles; (None, None) when none was kept yet."""
    if not summaries.exists():
        return None, None
    hint = f"delete {summaries.parent} to start over (the next load is then a first load)"
    meta = read_json(summaries, "load summaries", hint)
    rows = read_table(profiles, LOAD_PROFILE, "load profiles")
    try:
        current, previous = (
            _profile(meta[load], rows[rows["load"] == load]) if meta[load] else None
            for load in ("current", "previous")
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"load summaries are incomplete ({exc!r}); {hint}", path=summaries
        ) from None
    return current, previous


def _profile(summary: dict[str, Any], rows: pd.DataFrame) -> LoadProfile:
    def counts(kind: str) -> pd.Series:
        part = rows[rows["kind"] == kind]
        return _counts(pd.Series(part["interactions"].to_numpy(), index=part["id"]))

    return LoadProfile(
        load_id=str(summary["load_id"]),
        users=counts("user"),
        items=counts("item"),
        time_range=(
            int(summary["time_first"]),
            int(summary["time_median"]),
            int(summary["time_last"]),
        ),
    )
