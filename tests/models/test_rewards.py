"""Reward functions: values per completion, targets per row, NaN handling."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from models.constrained import sid_regex
from models.rewards import (
    CollaborativeReward,
    NonFiniteGuard,
    SemanticReward,
    rank_penalties,
    ranking_reward,
    rule_reward,
)


def test_rule_reward_is_one_only_for_each_rows_own_target():
    # two rows with the same history but different targets keep their own targets
    rewards = rule_reward(["x"] * 4, completion_item=[3, 5, 3, 5], target_index=[3, 3, 5, 5])
    assert rewards == [1.0, 0.0, 0.0, 1.0]


def test_rank_penalties_follow_ndcg_weights_and_sum_to_minus_one():
    p = rank_penalties(4)
    assert math.isclose(sum(p), -1.0)
    assert p[0] < p[1] < p[2] < p[3] < 0  # a wrong item at the top costs most
    assert math.isclose(p[0] / p[1], math.log2(3) / math.log2(2))


def test_ranking_reward_penalizes_wrong_items_by_rank_only_in_groups_with_the_target():
    p = rank_penalties(3)
    rewards = ranking_reward(
        ["x"] * 6,
        completion_item=[7, 2, 9, 1, 4, 6],
        target_index=[2, 2, 2, 5, 5, 5],
        rank=[0, 1, 2, 0, 1, 2],
        num_generations=3,
    )
    assert rewards[:3] == [p[0], 1.0, p[2]]
    assert rewards[3:] == [0.0, 0.0, 0.0]  # target missed: no ranking signal


def test_semantic_reward_is_cosine_similarity_to_the_target():
    emb = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=np.float32)
    reward = SemanticReward(embeddings=emb)
    out = reward(["x"] * 3, completion_item=[0, 1, -1], target_index=[2, 2, 2])
    assert out[0] == pytest.approx(1 / math.sqrt(2)) and out[1] == pytest.approx(1 / math.sqrt(2))
    assert out[2] is None  # not an item: unscorable


def test_collaborative_reward_is_sasrec_probability_of_the_item():
    from models.baselines.sasrec import SASRec, SASRecConfig

    torch.manual_seed(0)
    config = SASRecConfig(hidden=8, heads=1, blocks=1, max_len=5)
    model = SASRec(item_ids=[f"i{n}" for n in range(6)], config=config)
    reward = CollaborativeReward(model=model, max_len=5)
    out = reward(["x"] * 6, completion_item=list(range(6)), history_index=[[0, 1]] * 6)
    assert sum(out) == pytest.approx(1.0, abs=1e-5)  # a distribution over the catalog
    assert all(0 < v < 1 for v in out)


def test_non_finite_guard_counts_and_drops_nan_and_inf():
    logged = {}
    guard = NonFiniteGuard(lambda completions, **_: [1.0, math.nan, math.inf, None], "flaky")
    out = guard(["a"] * 4, log_metric=lambda name, v: logged.__setitem__(name, v))
    assert out == [1.0, None, None, None]
    assert guard.count == 2 and logged == {"rewards/flaky/non_finite": 2.0}
    assert guard.__name__ == "flaky"


def test_sid_regex_matches_exactly_the_catalog():
    sids = ["<a_1><b_2>", "<a_1><b_3>", "<a_10><b_2>"]
    pattern = re.compile(sid_regex(sids))
    assert all(pattern.fullmatch(s) for s in sids)
    for other in ("<a_1><b_1>", "<a_10><b_3>", "<a_1>", "<a_1><b_2><c_0>"):
        assert not pattern.fullmatch(other)
