"""Evaluate's pieces that need no trained model: which items a row may not be shown, the
invalid rate of a SID model's rankings, the words of the run summary, and the baselines' rows
(EASE and the blend beside popularity and SASRec, the best baseline) on the tiny recommender's
random model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tasks.evaluate import _score, exclusions, summary_line, verdict

TINY_ITEMS = [f"i{n}" for n in range(12)]
"""The tiny recommender's catalog (tests/conftest.py: ``tiny_project``)."""


def _rows(user: str, history: list[str], target: str, stamp: int) -> dict:
    return {"user_id": user, "history": history, "target": target, "timestamp": stamp}


SPLITS = {
    "train": pd.DataFrame([_rows("u", ["a"], "b", 1), _rows("v", ["x"], "y", 1)]),
    "valid": pd.DataFrame([_rows("u", ["a", "b"], "c", 2), _rows("v", ["x", "y"], "z", 2)]),
    "test": pd.DataFrame([_rows("u", ["b", "c"], "d", 3)]),
}


def test_test_rows_exclude_the_train_and_valid_items_and_valid_rows_the_train_items(
    make_settings, project
):
    settings = make_settings(project)
    assert settings.evaluate.exclude_seen
    # u's valid target c is seen before its test target: never recommended for the test row
    assert exclusions(settings, SPLITS, "test", SPLITS["test"]) == [["a", "b", "c"]]
    valid_rows = SPLITS["valid"]
    assert exclusions(settings, SPLITS, "valid", valid_rows) == [["a", "b"], ["x", "y"]]
    repeats = make_settings(project, evaluate={"exclude_seen": False})
    assert exclusions(repeats, SPLITS, "test", SPLITS["test"]) is None


def test_invalid_rate_counts_the_misses_exclusion_does_not_explain():
    # 2 rows, k = 3; row 0 could rank 3 items but got one -1 (an invalid SID); row 1 had only
    # 2 items left after exclusion, so its one -1 is expected
    topk = np.array([[0, 1, -1], [2, 3, -1]])
    rows, frames = _score(
        {"sft": topk, "sasrec": topk},
        targets=np.array([1, 0]),
        ks=[1, 3],
        counts=np.array([5, 4, 3, 2]),
        allowed=np.array([4, 2]),
    )
    assert rows["sft"]["invalid_rate"] == round(1 / 6, 6)  # reported to 6 places
    assert "invalid_rate" not in rows["sasrec"]  # a baseline ranks items, not SIDs
    assert frames["sft"]["hr@3"].tolist() == [1.0, 0.0] and rows["sft"]["hr@1"] == 0.0
    assert rows["sft"]["ndcg@3"] == round(0.5 / np.log2(3), 6)


@pytest.mark.parametrize(
    ("low", "high", "words"),
    [(0.001, 0.01, "beats"), (-0.01, -0.001, "trails"), (-0.01, 0.01, "is within noise of")],
)
def test_beats_only_where_the_interval_excludes_zero(low, high, words):
    assert verdict({"mean": (low + high) / 2, "low": low, "high": high}) == words
    assert verdict({"mean": 0.0, "low": 0.0, "high": 0.01}) == "is within noise of"


# --- the baselines' rows: EASE and the blend beside popularity and SASRec -------------------


@pytest.fixture
def tiny_eval(project, tiny_project):
    """The tiny recommender split, its baselines chosen and everything evaluated."""
    settings = tiny_project.settings(project)
    tiny_project.write(settings)
    return settings, tiny_project.evaluate(settings)


def _ndcg10(ranking: list[str], target: str) -> float:
    return 1 / np.log2(ranking.index(target) + 2) if target in ranking[:10] else 0.0


def test_evaluate_ranks_ease_by_its_closed_form_on_the_same_rows(tiny_eval):
    from models.baselines.ease import EASE
    from tasks.shared.inputs import read_split

    settings, report = tiny_eval
    for split in ("valid", "test"):
        assert list(report[split]) == ["popularity", "sasrec", "ease", "blend", "sft"]
        for model in ("ease", "blend"):
            row = report[split][model]
            assert {f"{m}@{k}" for m in ("hr", "ndcg") for k in (1, 5, 10)} <= set(row)
            assert "invalid_rate" not in row  # baselines rank items, not SIDs
    choice = json.loads(settings.paths.ease_choice.read_text())
    assert choice["l2"] in settings.ease.l2_grid and choice["alpha"] in settings.ease.blend_alphas
    splits = {s: read_split(settings, s) for s in ("train", "valid", "test")}
    model = EASE(item_ids=TINY_ITEMS, l2=choice["l2"], recency=choice["recency"])
    model.fit(splits["train"])
    users = pd.read_parquet(settings.paths.eval_users)
    ease = users[(users["split"] == "test") & (users["model"] == "ease")]
    test = splits["test"]
    assert ease["user_id"].tolist() == test["user_id"].tolist()  # the same users, same order
    seen = exclusions(settings, splits, "test", test)
    scores = model.scores([list(h) for h in test["history"]])
    ndcg = []
    for row, (ranking, target) in enumerate(zip(ease["ranking"], test["target"], strict=True)):
        allowed = [i for i in range(len(TINY_ITEMS)) if TINY_ITEMS[i] not in seen[row]]
        expected = np.sort(scores[row, allowed])[::-1][: len(ranking)]
        got = scores[row, [TINY_ITEMS.index(i) for i in ranking]]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)  # ties in any order
        assert not set(ranking) & set(seen[row])
        ndcg.append(_ndcg10(list(ranking), target))
    assert report["test"]["ease"]["ndcg@10"] == pytest.approx(np.mean(ndcg), abs=1e-6)
    assert ease["ndcg@10"].tolist() == pytest.approx(ndcg)


def test_evaluate_names_the_best_baseline_of_the_gate_half_and_compares_with_it(tiny_eval):
    from models.stats import paired_bootstrap_interval
    from tasks.evaluate import BASELINES

    settings, report = tiny_eval
    valid = report["valid"]
    best = report["best_baseline"]
    assert best in BASELINES and valid[best]["ndcg@10"] == max(
        valid[m]["ndcg@10"] for m in BASELINES
    )
    users = pd.read_parquet(settings.paths.eval_users)
    paired = report["paired"]
    for split in ("valid", "test"):
        assert list(paired[split]) == [
            "sft - sasrec",
            "best generative - sasrec",
            "sft - best baseline",
            "best generative - best baseline",
        ]
        rows = users[users["split"] == split]
        sft, base = (rows[rows["model"] == m] for m in ("sft", best))
        expected = paired_bootstrap_interval(
            sft["ndcg@10"].to_numpy(),
            base["ndcg@10"].to_numpy(),
            groups=sft["user_id"].to_numpy(),
            n_resamples=settings.evaluate.bootstrap_resamples,
            seed=settings.project.seed,
        )
        shown = paired[split]["sft - best baseline"]["ndcg@10"]
        assert (shown["mean"], shown["low"], shown["high"]) == pytest.approx(
            (expected.mean, expected.low, expected.high), abs=1e-6
        )
    assert set(report["intervals"]["test"]) == {"popularity", "sasrec", "ease", "blend", "sft"}
    choice = json.loads(settings.paths.ease_choice.read_text())
    assert report["protocol"]["baselines"] == {
        "ran": ["popularity", "sasrec", "ease", "blend"],
        "left_out": {},
        "best_baseline": "the baseline with the highest NDCG@10 on the gate half",
        "ease": {"l2": choice["l2"], "recency": choice["recency"]},
        "blend": {"alpha": choice["alpha"]},
        "chosen_on": "selection half of the validation users (the baselines stage)",
    }
    assert set(report["protocol"]["fingerprints"]) == {
        "split",
        "sid_map",
        "sasrec",
        "ease",
        "sft_model",
    }


def test_the_blend_at_weight_zero_ranks_as_sasrec(project, tiny_project):
    settings = tiny_project.settings(project, ease={"blend_alphas": [0.0]})
    tiny_project.write(settings)
    report = tiny_project.evaluate(settings)
    users = pd.read_parquet(settings.paths.eval_users)
    for split in ("valid", "test"):
        rankings = {
            m: users[(users["split"] == split) & (users["model"] == m)]["ranking"].map(list)
            for m in ("sasrec", "blend")
        }
        assert rankings["blend"].tolist() == rankings["sasrec"].tolist()
        assert report[split]["blend"] == report[split]["sasrec"]


def test_past_the_catalog_limit_ease_and_the_blend_are_left_out_with_the_reason(
    tiny_eval, monkeypatch
):
    from tasks.evaluate import evaluate

    settings, _ = tiny_eval
    # the catalog outgrew EASE's limit after the baselines stage chose: evaluate leaves the
    # rows out too, with the reason, and the baselines stage says the same when run again
    monkeypatch.setattr("models.baselines.ease.MAX_ITEMS", 11)
    reason = (
        "the catalog has 12 items, above EASE's limit of 11 (it inverts a dense items × items "
        "matrix), so the ease and blend rows are left out"
    )
    for rerun_baselines in (False, True):
        if rerun_baselines:
            from tasks.baselines import baselines

            baselines(settings)
            assert json.loads(settings.paths.ease_choice.read_text())["left_out"] == reason
        report = evaluate(settings).metrics
        assert list(report["test"]) == ["popularity", "sasrec", "sft"]
        assert report["protocol"]["baselines"] == {
            "ran": ["popularity", "sasrec"],
            "left_out": {"ease": reason, "blend": reason},
            "best_baseline": "the baseline with the highest NDCG@10 on the gate half",
        }
        valid = report["valid"]
        assert report["best_baseline"] == max(
            ("popularity", "sasrec"), key=lambda m: (valid[m]["ndcg@10"], m == "popularity")
        )
        assert "sft - best baseline" in report["paired"]["test"]
        users = pd.read_parquet(settings.paths.eval_users)
        assert set(users["model"]) == {"popularity", "sasrec", "sft"}


def test_evaluate_needs_the_ease_choice(tiny_eval):
    from sidrec.errors import InputError
    from tasks.evaluate import evaluate

    settings, _ = tiny_eval
    settings.paths.ease_choice.unlink()
    with pytest.raises(InputError, match=r"the EASE choice not found; run `sidrec baselines`"):
        evaluate(settings)


def test_the_best_baseline_is_the_best_on_the_gate_half_not_on_test():
    from tasks.evaluate import best_baseline

    def frame(split: str, scores: dict[str, list[float]]) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"split": split, "model": m, "user_id": f"u{i}", "ndcg@10": v, "ndcg@5": 1 - v}
                for m, values in scores.items()
                for i, v in enumerate(values)
            ]
        )

    gate = {"popularity": [0.0, 0.25], "sasrec": [0.5, 0.0], "ease": [0.25, 0.75]}
    users = pd.concat(
        [
            frame("valid", {**gate, "blend": [0.5, 0.25], "sft": [1.0, 1.0]}),  # sft: no baseline
            frame("test", {"popularity": [0.0, 0.0], "sasrec": [1.0, 1.0], "ease": [0.0, 0.0]}),
        ]
    )
    assert best_baseline(users, [1, 5, 10]) == "ease"  # 0.5 on the gate half
    tie = frame("valid", {**gate, "blend": [0.75, 0.25]})  # blend 0.5 too
    assert best_baseline(tie, [10]) == "ease"  # a tie: the first of popularity … blend
    # without K = 10 the largest K decides (here ndcg@5 = 1 - ndcg@10: popularity leads)
    assert best_baseline(users, [1, 5]) == "popularity"


def test_the_summary_compares_each_generative_model_with_sasrec_and_the_best_baseline():
    def interval(mean: float, low: float, high: float) -> dict[str, float]:
        return {"mean": mean, "low": low, "high": high}

    models = ("popularity", "sasrec", "ease", "blend", "sft", "grpo")
    report = {
        "ks": [10],
        "test": {m: {"ndcg@10": 0.1} for m in models},
        "intervals": {"test": {m: {"ndcg@10": interval(0.1, 0.05, 0.15)} for m in models}},
        "best_baseline": "blend",
        "paired": {
            "test": {
                "sft - sasrec": {"ndcg@10": interval(0.01, 0.002, 0.02)},
                "sft - best baseline": {"ndcg@10": interval(-0.02, -0.03, -0.01)},
                "grpo - sasrec": {"ndcg@10": interval(0.0, -0.01, 0.01)},
                "grpo - best baseline": {"ndcg@10": interval(-0.01, -0.02, 0.001)},
            }
        },
    }
    line = summary_line(report)
    assert line.startswith("test NDCG@10: popularity 0.1000 [0.0500, 0.1500] · sasrec ")
    assert line.endswith(
        " · sft beats sasrec (+0.0100 [+0.0020, +0.0200]) and trails the best baseline blend "
        "(-0.0200 [-0.0300, -0.0100]) · grpo is within noise of sasrec (+0.0000 [-0.0100, "
        "+0.0100]) and is within noise of the best baseline blend (-0.0100 [-0.0200, +0.0010])"
    )


def test_the_protocol_says_how_much_history_each_model_reads(tiny_eval):
    settings, report = tiny_eval
    history = report["protocol"]["history"]
    protocol = settings.split.max_history
    assert history["protocol_items"] == protocol
    assert history["sasrec_items"] == (settings.sasrec.max_len or protocol)
    assert history["ease_items"] == protocol
    levels = len(next(iter(json.loads(settings.paths.sid_map.read_text()).values())))
    fits = (settings.model.max_length - 1) // (levels + 1)  # BOS, then L SID tokens + EOS
    generative = history["generative"]
    assert generative["context_items"] == (fits if protocol is None else min(fits, protocol))
    assert generative["context_tokens"] == settings.model.max_length
    assert generative["cut_prompts"] == {
        s: {"sft": report[s]["sft"]["truncated_prompts"]} for s in ("valid", "test")
    }


def test_the_baselines_alone_are_scored_as_evaluate_scores_them(tiny_eval):
    from tasks.evaluate import score_models

    settings, report = tiny_eval
    written = settings.paths.metrics("eval").read_bytes()
    alone, users = score_models(settings, generative=False)
    for split in ("valid", "test"):
        assert list(alone[split]) == ["popularity", "sasrec", "ease", "blend"]
        for model in alone[split]:
            assert alone[split][model] == report[split][model]
    assert alone["best_generative"] is None and alone["best_baseline"] == report["best_baseline"]
    assert "generative" not in alone["protocol"]["history"]
    assert "sft_model" not in alone["protocol"]["fingerprints"]
    assert set(users["model"]) == {"popularity", "sasrec", "ease", "blend"}
    assert settings.paths.metrics("eval").read_bytes() == written  # it writes nothing
