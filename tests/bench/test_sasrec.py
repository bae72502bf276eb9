"""bench/sasrec.py: which settings it compares, and its summary over seeds (means, and each
setting's paired gate / test difference against the first, pooled per user over the seeds)."""

from __future__ import annotations

import argparse

import pytest

from bench.sasrec import configs_of, label_of, summary


def _args(configs: list[str], max_lens: list[int]) -> argparse.Namespace:
    return argparse.Namespace(configs=configs, max_lens=max_lens)


def test_configs_are_the_given_settings_or_the_two_window_lengths() -> None:
    assert configs_of(_args([], [])) == [["sasrec.max_len=20"], ["sasrec.max_len=50"]]
    both = configs_of(_args(["", "sasrec.hidden=128 sasrec.dropout=0.5"], [30]))
    assert both == [[], ["sasrec.hidden=128", "sasrec.dropout=0.5"], ["sasrec.max_len=30"]]
    assert [label_of(c) for c in both] == ["params.yaml", "hidden=128 dropout=0.5", "max_len=30"]


def _run(seed: int, config: str, gate: list[float], test: list[float]) -> dict:
    """One run's record as main() keeps it: training metrics and per-user seen-excluded scores."""
    return {
        "seed": seed,
        "config": config,
        "trained": {
            "seconds": 10.0 * (seed + 1),
            "best_epoch": 4,
            "valid_selection": {"ndcg@10": 0.5},
        },
        "scores": {
            "gate users": ["a", "b"],
            "test users": ["a", "b", "c"],
            "gate seen-excluded": {"ndcg@10": gate},
            "test seen-excluded": {"ndcg@10": test},
        },
    }


def test_summary_pools_each_users_mean_over_seeds_against_the_first_setting() -> None:
    results = [
        _run(0, "base", [0.2, 0.4], [0.1, 0.1, 0.4]),
        _run(0, "wide", [0.4, 0.4], [0.1, 0.1, 0.4]),
        _run(1, "base", [0.4, 0.0], [0.3, 0.1, 0.2]),
        _run(1, "wide", [0.6, 0.2], [0.3, 0.1, 0.2]),
    ]
    base, wide = summary(results, ["base", "wide"])
    assert base["seeds"] == [0, 1] and base["train_s"] == pytest.approx(15.0)
    assert base["gate"] == pytest.approx(0.25) and wide["gate"] == pytest.approx(0.4)
    assert "gate_diff" not in base
    # every user gained 0.1 or 0.2 on the gate half: the whole interval is above 0
    diff = wide["gate_diff"]
    assert diff["mean"] == pytest.approx(0.15) and 0.1 <= diff["low"] <= diff["high"] <= 0.2
    assert wide["test_diff"] == {"mean": 0.0, "low": 0.0, "high": 0.0}


def test_summary_refuses_seeds_scored_on_other_users() -> None:
    other = _run(1, "base", [0.4, 0.0], [0.3, 0.1, 0.2])
    other["scores"]["gate users"] = ["a", "z"]
    with pytest.raises(ValueError, match="the seeds' gate users differ"):
        summary([_run(0, "base", [0.2, 0.4], [0.1, 0.1, 0.4]), other], ["base"])
