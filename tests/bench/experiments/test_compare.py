"""bench/experiments/compare.py: one pair of runs, several pairs pooled over seeds as bench.quality pools
them (each user's mean over the pairs), and the refusals (odd folder count, other users)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.experiments.compare import main
from sidrec.errors import InputError


def _run(root: Path, name: str, scores: dict[str, list[float]]) -> Path:
    """A run folder whose test split scored users u0, u1, ... with ``scores`` per model."""
    rows = [
        {"split": "test", "model": model, "user_id": f"u{i}", "ndcg@10": v, "hr@10": float(v > 0)}
        for model, values in scores.items()
        for i, v in enumerate(values)
    ]
    (root / name / "metrics").mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(root / name / "metrics" / "eval_users.parquet")
    return root / name


def _compare(monkeypatch: pytest.MonkeyPatch, capsys, *args: object) -> str:
    monkeypatch.setattr(sys, "argv", ["compare", *map(str, args), "--threads", "1"])
    main()
    return capsys.readouterr().out


def test_pairs_pool_each_users_mean_over_seeds(tmp_path, monkeypatch, capsys) -> None:
    a0 = _run(tmp_path, "a0", {"sft": [0.0, 0.2, 0.4, 0.2]})
    b0 = _run(tmp_path, "b0", {"sft": [0.1, 0.2, 0.4, 0.2]})
    a1 = _run(tmp_path, "a1", {"sft": [0.2, 0.2, 0.0, 0.2]})
    b1 = _run(tmp_path, "b1", {"sft": [0.5, 0.2, 0.0, 0.2]})
    one = _compare(monkeypatch, capsys, a0, b0)
    assert "| ndcg@10 | 0.2000 | 0.2250 | +0.0250 [" in one
    pooled = _compare(monkeypatch, capsys, a0, b0, a1, b1)
    assert "each user's mean over 2 pairs" in pooled
    # A: (0.1, 0.2, 0.2, 0.2) -> 0.175; B: (0.3, 0.2, 0.2, 0.2) -> 0.225
    assert "| ndcg@10 | 0.1750 | 0.2250 | +0.0500 [" in pooled
    # B - A per user and pair: (0.1, 0, 0, 0), (0.3, 0, 0, 0); users' variance of the means 0.01,
    # within-user seed variance 0.02 / 4 users = 0.005 of which a mean over 2 pairs keeps half:
    # +- 1.96 sqrt(0.01 / 4) now and 1.96 sqrt((0.01 - 0.0025) / 4) with endless seeds
    assert "ndcg@10: B - A ± 0.0980 with these 2 pairs" in pooled
    assert "± 0.0849 with endless seeds" in pooled
    assert "endless seeds" not in one


def test_an_odd_folder_count_or_other_users_are_refused(tmp_path, monkeypatch, capsys) -> None:
    a = _run(tmp_path, "a", {"sft": [0.1, 0.2]})
    b = _run(tmp_path, "b", {"sft": [0.1, 0.2, 0.3]})
    with pytest.raises(InputError, match="runs come in pairs"):
        _compare(monkeypatch, capsys, a, a, b)
    with pytest.raises(InputError, match="scored different test users"):
        _compare(monkeypatch, capsys, a, b)


def test_a_split_with_several_rows_per_user_is_refused(tmp_path, monkeypatch, capsys) -> None:
    a = _run(tmp_path, "a", {"sft": [0.1, 0.2]})
    table = pd.read_parquet(a / "metrics" / "eval_users.parquet")
    table["user_id"] = "u0"  # a sliding-window split: one user, two test rows
    table.to_parquet(a / "metrics" / "eval_users.parquet")
    with pytest.raises(InputError, match=r"1 user\(s\) have several test rows .*'u0'"):
        _compare(monkeypatch, capsys, a, a)
