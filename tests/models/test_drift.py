"""Drift between two loads (models/drift.py) on small frames: values, not just that it ran."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models.drift import (
    LoadProfile,
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
    assert user["psi"] == pytest.approx(0.0, abs=1e-9) and not user["drift"]
    assert (user["before"]["max"], user["after"]["max"]) == (20.0, 60.0)
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
