"""bench.blend: SASRec scores as evaluate scores it, EASE and the blend rank the same test users
with the same exclusions, and α is one of the given weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.blend import run_scores
from sidrec.config import Settings
from tasks.evaluate import evaluate
from tasks.shared.inputs import read_split


def test_sasrec_scores_as_evaluate_and_a_zero_weight_blend_is_sasrec(trained: Settings) -> None:
    evaluate(trained)
    report = json.loads(trained.paths.metrics("eval").read_text())
    result = run_scores(trained, alphas=[0.0])
    test = read_split(trained, "test")
    assert list(result.ndcg.index) == test["user_id"].astype(str).tolist()
    assert result.ndcg["sasrec"].mean() == pytest.approx(
        report["test"]["sasrec"]["ndcg@10"], abs=5e-7
    )
    assert result.alpha == 0.0
    np.testing.assert_array_equal(result.ndcg["blend"], result.ndcg["sasrec"])
    assert result.ndcg.isin([0.0, *(1 / np.log2(np.arange(2, 12)))]).all().all()


def test_alpha_comes_from_the_given_weights_and_ease_follows_its_options(trained: Settings) -> None:
    result = run_scores(trained, l2=10.0, recency=0.5, alphas=[0.25, 4.0])
    assert result.alpha in (0.25, 4.0)
    other = run_scores(trained, l2=10.0, recency=1.0, alphas=[0.25])
    # with a set (recency 1) EASE no longer knows which item came last: its ranking changes
    assert not np.array_equal(result.ndcg["ease"], other.ndcg["ease"])


def test_the_runs_own_models_join_the_blends_table(trained: Settings) -> None:
    import pandas as pd

    from bench.blend import with_models
    from sidrec.errors import InputError

    evaluate(trained)
    run = trained.paths.metrics("eval").parent.parent  # the folder holding metrics/
    result = with_models(run_scores(trained, alphas=[0.25]), run, ["sft"])
    assert list(result.ndcg.columns) == ["sasrec", "ease", "blend", "sft"]
    table = pd.read_parquet(run / "metrics" / "eval_users.parquet")
    sft = table[(table["split"] == "test") & (table["model"] == "sft")]
    expected = sft.set_index(sft["user_id"].astype(str))["ndcg@10"]
    np.testing.assert_array_equal(result.ndcg["sft"], expected.loc[result.ndcg.index])
    with pytest.raises(InputError, match="no test rows of model 'grpo'"):
        with_models(run_scores(trained, alphas=[0.25]), run, ["grpo"])
    with pytest.raises(ValueError, match="'sasrec' is computed here"):
        with_models(result, run, ["sasrec"])
