"""Drift between two loads (models/drift.py) on small frames: values, not just that it ran."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models.drift import (
    DISTRIBUTIONS,
    LoadProfile,
    compare_distributions,
    compare_loads,
    drift_line,
    drift_markdown,
    profile_load,
    psi,
    read_profiles,
    write_profiles,
)
from sidrec.io import AtomicOutputs

CATALOG = pd.DataFrame({"item_id": [f"i{n}" for n in range(40)]})


def interactions(
    activity: list[int], *, first_user: int = 0, t0: int = 1_600_000_000
) -> pd.DataFrame:
    """User ``first_user + u`` has ``activity[u]`` interactions, with items i0, i1, ... (so
    item popularity falls with the item number), one second apart."""
    rows = [
        (f"u{first_user + u}", f"i{k % 40}", t0 + 10 * u + k)
        for u, n in enumerate(activity)
        for k in range(n)
    ]
    return pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"])


def load(activity: list[int], load_id: str, **kw: int) -> LoadProfile:
    return profile_load(interactions(activity, **kw), CATALOG, load_id=load_id)


SPREAD = [2, 3, 4, 5, 6, 8, 10, 12, 15, 20] * 6
"""60 users with a spread of activity."""


def test_profile_counts_users_items_and_time():
    profile = load([3, 1, 2], "x")
    assert profile.users.to_dict() == {"u0": 3, "u1": 1, "u2": 2}
    assert profile.items["i0"] == 3 and profile.items["i2"] == 1 and profile.items["i39"] == 0
    assert len(profile.items) == 40  # every catalog item, with or without interactions
    assert profile.time_range == (1_600_000_000, 1_600_000_006, 1_600_000_021)
    assert profile.summary()["interactions"] == 6


def test_first_load_has_nothing_to_compare_with():
    report = compare_loads(None, load(SPREAD, "a"), psi_threshold=0.2)
    assert report["status"] == "first load" and report["baseline"] is None
    assert report["flagged"] == [] and "no earlier load" in report["note"]
    assert drift_line(report) == "first load"
    assert "first load" in drift_markdown(report, "ds") and "`a`" in drift_markdown(report, "ds")


def test_the_same_distribution_is_no_drift():
    report = compare_loads(load(SPREAD, "a"), load(SPREAD, "b"), psi_threshold=0.2)
    assert report["status"] == "no drift" and report["flagged"] == []
    for d in report["distributions"].values():
        assert d["psi"] == pytest.approx(0.0, abs=1e-9) and d["ks"] == 0.0
    assert report["users"]["new"] == report["users"]["vanished"] == 0
    assert report["top_items"] == {"k": 40, "kept": 1.0}
    assert report["sizes"]["interactions"]["change"] == 0.0


def test_an_evenly_grown_log_is_not_drift_but_its_growth_is_reported():
    """Every user three times as active: the shape is the same, the sizes say the log grew."""
    report = compare_loads(load(SPREAD, "a"), load([3 * n for n in SPREAD], "b"), psi_threshold=0.2)
    user = report["distributions"]["interactions_per_user"]
    assert user["psi"] == pytest.approx(0.0, abs=1e-9) and user["ks"] == 0.0 and not user["drift"]
    assert (user["before"]["max"], user["after"]["max"]) == (20.0, 60.0)
    assert user["level"] == 3.0 and "level ×3.00" in drift_markdown(report, "ds")
    assert report["sizes"]["interactions"]["change"] == pytest.approx(2.0)


def test_a_shifted_distribution_is_flagged():
    """Activity concentrated on a few heavy users instead of spread out."""
    skewed = [1] * 50 + [60] * 10
    report = compare_loads(load(SPREAD, "a"), load(skewed, "b"), psi_threshold=0.2)
    user = report["distributions"]["interactions_per_user"]
    assert user["psi"] > 1.0 and user["ks"] > 0.5 and user["drift"]
    assert report["status"] == "drift" and "interactions_per_user" in report["flagged"]
    assert drift_line(report).startswith("drift (interactions per user PSI")
    assert "**drift**" in drift_markdown(report, "ds")
    # a higher threshold reports the same numbers without flagging them
    lenient = compare_loads(load(SPREAD, "a"), load(skewed, "b"), psi_threshold=50.0)
    assert lenient["status"] == "no drift"
    assert lenient["distributions"]["interactions_per_user"]["psi"] == user["psi"]


def zipf_catalog(size: int = 1682) -> pd.Series:
    """Interactions per item of a catalog the size of MovieLens-100K's, Zipf-shaped: most items
    have one or two interactions, tied, and a few have hundreds."""
    counts = np.random.default_rng(1).zipf(1.8, size=size).clip(max=600)
    return pd.Series(counts, index=[f"i{n}" for n in range(size)])


def activity(size: int = 5000) -> pd.Series:
    """Interactions per user: at least 6 each, geometric above that (mean about 15)."""
    counts = 5 + np.random.default_rng(0).geometric(0.1, size=size)
    return pd.Series(counts, index=[f"u{n}" for n in range(size)])


def test_one_cold_item_added_to_a_zipf_catalog_is_not_drift():
    """Whole groups of tied counts sit on the deciles; one more item (with no interactions) must
    not move any of them into another bin."""
    before = zipf_catalog()
    after = pd.concat([before, pd.Series({"new-item": 0})])
    d = compare_distributions(before, after, psi_threshold=0.2)
    assert d["psi"] < 0.01 and d["ks"] < 0.001 and not d["drift"]
    assert d["level"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("count", [6, 14, 30, 200])
def test_one_more_ordinary_user_is_not_drift(count):
    before = activity()
    after = pd.concat([before, pd.Series({"new-user": count})])
    d = compare_distributions(before, after, psi_threshold=0.2)
    assert d["psi"] < 0.001 and d["ks"] < 0.001 and not d["drift"]


def test_one_heavy_new_user_on_a_small_log_is_not_drift():
    """A user (or bot) who touched every item joins 60 users: one more user at the top, and
    every item one interaction more: neither distribution changed shape enough to flag."""
    users = [5 + u % 10 for u in range(60)]
    before, after = load(users, "a"), load([*users, 40], "b")
    report = compare_loads(before, after, psi_threshold=0.2)
    assert report["status"] == "no drift" and report["flagged"] == []
    user, item = (report["distributions"][k] for k in DISTRIBUTIONS)
    assert user["psi"] < 0.01 and user["ks"] == round(1 / 61, 4)  # one user in 61
    assert item["psi"] < 0.05
    # 26 of the 40 items had no interaction and now have one: KS shows it, PSI does not flag
    # it (0 and 1 share the lowest bin)
    assert item["ks"] == 26 / 40


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # the more active half of the users twice as active, the others unchanged
        (activity(), activity().where(lambda s: s <= s.median(), 2 * activity())),
        # popularity with a thinner tail: more items with one interaction (Zipf exponent 1.8 -> 2.5)
        (
            zipf_catalog(),
            pd.Series(np.random.default_rng(2).zipf(2.5, size=1682).clip(max=600)),
        ),
        # a wave of newcomers at the minimum activity: 30% more users, all with 6
        (activity(), pd.concat([activity(), pd.Series([6] * 1500)], ignore_index=True)),
    ],
    ids=["heavy-half-doubled", "thinner-tail", "newcomer-wave"],
)
def test_a_change_of_shape_is_flagged(before, after):
    d = compare_distributions(before, after, psi_threshold=0.2)
    assert d["drift"] and d["psi"] > 0.25 and d["ks"] > 0.1


def test_psi_is_zero_for_equal_samples_and_grows_with_the_shift():
    rng = np.random.default_rng(0)
    base = rng.normal(size=5000)
    assert psi(base, base) == pytest.approx(0.0, abs=1e-12)
    small, large = psi(base, base + 0.1), psi(base, base + 1.0)
    assert 0 < small < 0.1 < 0.25 < large
    # all mass in one bin the baseline barely fills: large but finite (shares floored)
    assert np.isfinite(psi(base, np.full(100, 10.0)))


def test_new_and_vanished_users_and_items_are_counted():
    before = load([3, 3, 3, 3], "a")  # users u0..u3; items i0..i2 used
    after = profile_load(
        interactions([3, 3, 3, 3], first_user=2),  # users u2..u5
        pd.DataFrame({"item_id": [f"i{n}" for n in range(2, 42)]}),  # i0, i1 gone; i40, i41 new
        load_id="b",
    )
    report = compare_loads(before, after, psi_threshold=0.2)
    users = report["users"]
    assert (users["new"], users["vanished"]) == (2, 2)
    assert users["new_examples"] == ["u4", "u5"] and users["vanished_examples"] == ["u0", "u1"]
    assert users["new_share"] == 0.5 and users["vanished_share"] == 0.5
    items = report["items"]
    assert (items["new"], items["vanished"]) == (2, 2)
    assert items["new_examples"] == ["i40", "i41"] and items["vanished_examples"] == ["i0", "i1"]


def test_time_ranges_are_in_the_report():
    later = load(SPREAD, "b", t0=1_700_000_000)
    report = compare_loads(load(SPREAD, "a"), later, psi_threshold=0.2)
    assert report["baseline"]["time_first"] == 1_600_000_000
    assert report["load"]["time_first"] == 1_700_000_000
    assert "2020-09-13 – 2020-09-13 | 2023-11-14 – 2023-11-14" in drift_markdown(report, "ds")


def test_profiles_round_trip_through_their_files(tmp_path):
    current, previous = load([3, 1, 2], "now"), load(SPREAD, "before")
    files = {"profiles": tmp_path / "p.parquet", "summaries": tmp_path / "p.json"}
    assert read_profiles(**files) == (None, None)
    with AtomicOutputs() as out:
        write_profiles(out, **files, current=current, previous=previous)
    again, earlier = read_profiles(**files)
    assert again is not None and earlier is not None
    assert again.load_id == "now" and again.time_range == current.time_range
    pd.testing.assert_series_equal(again.users, current.users)
    pd.testing.assert_series_equal(again.items, current.items)
    pd.testing.assert_series_equal(earlier.users, previous.users)
    # the first load is kept without a previous one
    with AtomicOutputs() as out:
        write_profiles(out, **files, current=current, previous=None)
    assert read_profiles(**files)[1] is None
