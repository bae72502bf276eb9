"""bench.experiments.breakdown: the selection half ranked as evaluate ranks, bucketed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bench.common import per_user_scores
from bench.experiments.breakdown import (
    breakdown,
    bucket_labels,
    selection_users,
    table,
)
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs


def test_bucket_labels_name_each_range_of_lower_edges() -> None:
    assert bucket_labels((0, 1, 4, 6)) == ["0", "1–3", "4–5", "6+"]
    assert bucket_labels((1, 2)) == ["1", "2+"]


def _users(scores: dict[str, list[float]], history: list[int]) -> pd.DataFrame:
    frames = [
        pd.DataFrame(
            {
                "split": "selection",
                "model": model,
                "user_id": [f"u{n}" for n in range(len(values))],
                "ndcg@10": values,
                "history_items": history,
            }
        )
        for model, values in scores.items()
    ]
    return pd.concat(frames, ignore_index=True)


def test_each_bucket_holds_its_users_means_and_paired_differences() -> None:
    users = _users(
        {"a": [0.0, 1.0, 0.5, 0.5, 0.0], "b": [1.0, 1.0, 0.5, 0.0, 0.0]},
        history=[2, 3, 30, 40, 500],
    )
    rows = breakdown(users, "history_items", (0, 1, 4, 21, 51), ["a", "b"], "a", resamples=200)
    assert [(r["bucket"], r["users"]) for r in rows] == [
        ("1–3", 2),
        ("21–50", 2),
        ("51+", 1),
        ("all", 5),
    ]
    first = rows[0]
    assert first["share"] == pytest.approx(0.4)
    assert first["ndcg@10"] == {"a": pytest.approx(0.5), "b": pytest.approx(1.0)}
    assert first["minus"]["b"]["diff"] == pytest.approx(0.5)
    assert first["minus"]["b"]["low"] <= 0.5 <= first["minus"]["b"]["high"]
    assert rows[1]["minus"]["b"]["diff"] == pytest.approx(-0.25)
    assert rows[-1]["ndcg@10"]["b"] == pytest.approx(0.5)
    assert "a" not in rows[-1]["minus"]  # no difference to itself
    assert rows[2]["minus"]["b"] == {"diff": 0.0, "low": None, "high": None}  # one user
    text = table("by history", rows, ["a", "b"], "a")
    assert "| 1–3 | 2 | 40.0% | 0.5000 | 1.0000 | +0.5000 [" in text
    assert "| 51+ | 1 | 20.0% | 0.0000 | 0.0000 | +0.0000 [n/a] |" in text
    with pytest.raises(InputError, match="no selection scores of c .*these models ran: a, b"):
        breakdown(users, "history_items", (0,), ["a", "c"], "a")


def test_the_selection_half_is_ranked_as_the_baselines_stage_scored_it(
    project, tiny_project, capsys
) -> None:
    """SASRec's mean there is the selection NDCG@10 the baselines stage chose its epoch by;
    the scores are saved where compare --split selection reads them."""
    from sidrec.protocol import validation_half
    from tasks.shared.inputs import read_split

    settings = tiny_project.settings(project)
    tiny_project.write(settings)
    tiny_project.evaluate(settings)
    users = selection_users(settings, generative=True)
    valid = read_split(settings, "valid")
    selection = set(validation_half(valid, "selection")["user_id"].astype(str))
    assert set(users["user_id"]) == selection == {"u3", "u6"}  # u2 has no valid row
    assert list(dict.fromkeys(users["model"])) == ["popularity", "sasrec", "ease", "blend", "sft"]
    sasrec = users[users["model"] == "sasrec"]
    chosen = json.loads(settings.paths.metrics("baselines").read_text())["valid_selection"]
    assert sasrec["ndcg@10"].mean() == pytest.approx(chosen["ndcg@10"], abs=1e-6)
    one = users[users["user_id"] == "u6"].iloc[0]
    # u6: i0 i2 i4 i6 → train i0 i2 (the last two are valid and test targets), target i4
    assert one["history_items"] == 2
    train = read_split(settings, "train")
    pairs = {
        (user, item)
        for user, history, target in zip(
            train["user_id"], train["history"], train["target"], strict=True
        )
        for item in [*history, target]
    }
    for _, row in users[users["model"] == "sasrec"].iterrows():  # the target's train users
        target = valid.set_index("user_id").loc[row["user_id"], "target"]
        assert row["target_train_count"] == sum(1 for _, item in pairs if item == target)
    with AtomicOutputs() as out:
        out.parquet(users, settings.paths.metrics_dir / "selection_users.parquet")
    scores = per_user_scores(settings.paths.metrics_dir.parent, "selection", "sft", ["ndcg@10"])
    assert set(scores.index) == selection
