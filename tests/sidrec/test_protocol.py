from __future__ import annotations

import pandas as pd
import pytest

from sidrec.config import SplitConfig
from sidrec.protocol import items_after, items_before, seen_items
from tasks.shared.inputs import recent_rows
from tasks.split import leave_one_out


def _train() -> pd.DataFrame:
    # u: a b c d e f (ties at t=3 keep file order: c before d); v: x y z w
    inter = pd.DataFrame(
        [("u", i, t) for i, t in [("a", 1), ("b", 2), ("c", 3), ("d", 3), ("e", 5), ("f", 6)]]
        + [("v", i, t) for i, t in [("x", 1), ("y", 2), ("z", 3), ("w", 4)]],
        columns=["user_id", "item_id", "timestamp"],
    )
    return leave_one_out(inter, SplitConfig(max_history=1))["train"]


def test_items_before_holds_only_the_past_of_each_train_row():
    train = _train()  # u's targets b c d (histories of 1 item), v's y
    rows = recent_rows(train, 2)
    got = dict(zip(rows["target"], items_before(train, rows), strict=True))
    assert got == {"c": ["a", "b"], "d": ["a", "b", "c"], "y": ["x"]}
    # the whole-history rule of later splits would hold the row's own target and its future
    later = dict(zip(rows["target"], seen_items(train, rows), strict=True))
    assert "c" in later["c"] and "d" in later["c"]


def test_items_before_follows_the_rows_order_not_the_splits():
    train = _train()
    rows = train.iloc[::-1]
    assert items_before(train, rows) == [["x"], ["a", "b", "c"], ["a", "b"], ["a"]]


def test_seen_items_hold_the_users_earlier_rows_of_the_scored_split():
    # a sliding-window test split: one user, three rows, histories capped at one item
    train = pd.DataFrame(
        {
            "user_id": ["u"] * 2,
            "history": [["i1"], ["i2"]],
            "target": ["i2", "i3"],
            "timestamp": [2, 3],
        }
    )
    test = pd.DataFrame(
        {
            "user_id": ["u"] * 3,
            "history": [["i3"], ["i4"], ["i5"]],
            "target": ["i4", "i5", "i6"],
            "timestamp": [4, 5, 6],
        }
    )
    assert seen_items(train, test) == [
        ["i1", "i2", "i3"],
        ["i1", "i2", "i3", "i4"],
        ["i1", "i2", "i3", "i4", "i5"],  # i4 fell out of the capped history, still seen
    ]
    # leave-one-out (one row per user) is unchanged: the row's own history is already in
    assert seen_items(train, test.iloc[[2]]) == [["i1", "i2", "i3", "i5"]]


def test_items_after_holds_each_rows_target_and_the_users_next_targets():
    train = _train()  # u's targets b c d (ties at t=3 in file order: c then d), v's y
    rows = train.iloc[::-1]  # any order of rows; the user's order comes from the split
    got = dict(zip(rows["target"], items_after(train, rows, 3), strict=True))
    # never another user's target, never the valid or test target (e, f; z, w)
    assert got == {"b": ["b", "c", "d"], "c": ["c", "d"], "d": ["d"], "y": ["y"]}
    assert items_after(train, rows, 2) == [["y"], ["d"], ["c", "d"], ["b", "c"]]
    assert items_after(train, rows, 1) == [[t] for t in rows["target"]]
    with pytest.raises(ValueError, match="count must be >= 1"):
        items_after(train, rows, 0)


def test_the_best_generative_model_is_chosen_on_the_selection_half(project, make_settings):
    import json

    from sidrec.errors import InputError
    from tasks.evaluate import best_generative

    settings = make_settings(project)
    assert best_generative(settings, ["sft"]) == "sft" and best_generative(settings, []) is None
    with pytest.raises(InputError, match="GRPO kept step not found; run `sidrec grpo` again"):
        best_generative(settings, ["sft", "grpo"])
    path = settings.paths.grpo_kept_step
    path.parent.mkdir(parents=True, exist_ok=True)
    # GRPO kept its start (step 0, the SFT weights): nothing beat SFT on the selection users
    path.write_text(json.dumps({"best_step": 0}))
    assert best_generative(settings, ["sft", "grpo"]) == "sft"
    path.write_text(json.dumps({"best_step": 50}))
    assert best_generative(settings, ["sft", "grpo"]) == "grpo"
    # the run's metrics (timings and all) play no part: only the model folder's record
    settings.paths.metrics("grpo").parent.mkdir(parents=True, exist_ok=True)
    settings.paths.metrics("grpo").write_text(json.dumps({"best_step": 0}))
    assert best_generative(settings, ["sft", "grpo"]) == "grpo"
    for bad in ({}, {"best_step": -1}, {"best_step": "50"}, [50]):
        path.write_text(json.dumps(bad))
        with pytest.raises(InputError, match="names no kept step"):
            best_generative(settings, ["sft", "grpo"])


def test_a_validation_sample_excludes_what_the_whole_half_would(project, make_settings):
    """A sliding-window user's sampled row still excludes the items of that user's earlier
    rows the sample left out (`sft.eval_users` / `grpo.eval_users` draw such a sample)."""
    from types import SimpleNamespace

    from sidrec.protocol import gate_user
    from tasks.shared.validation import ValidationSample

    user = next(u for u in (f"u{n}" for n in range(100)) if not gate_user(u))  # selection half
    train = pd.DataFrame(
        {"user_id": [user], "history": [["i1"]], "target": ["i2"], "timestamp": [2]}
    )
    valid = pd.DataFrame(
        {
            "user_id": [user] * 4,
            "history": [["i2"], ["i3"], ["i4"], ["i5"]],  # capped at one item
            "target": ["i3", "i4", "i5", "i6"],
            "timestamp": [3, 4, 5, 6],
        }
    )
    recommender = SimpleNamespace(index={f"i{n}": n for n in range(1, 7)})
    targets = set()
    for seed in range(8):
        settings = make_settings(project, project={"seed": seed})
        sample = ValidationSample(settings, recommender, train, valid, users=1)
        (target,) = sample.targets.tolist()
        assert sample.exclude == [[f"i{n}" for n in range(1, target)]]  # all before the target
        targets.add(target)
    assert len(targets) > 1  # the seeds drew different rows
