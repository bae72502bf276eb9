"""Reward functions: values per completion, targets per row, NaN handling."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from models.constrained import sid_regex
from models.rewards import (
    NO_TARGET,
    CollaborativeReward,
    GroupRank,
    NonFiniteGuard,
    SemanticReward,
    rank_penalties,
    ranking_reward,
    rule_reward,
)
from sidrec.config import GrpoConfig


def test_rule_reward_is_one_only_for_each_rows_own_target():
    # two rows with the same history but different targets keep their own targets
    rewards = rule_reward(["x"] * 4, completion_item=[3, 5, 3, 5], target_index=[3, 3, 5, 5])
    assert rewards == [1.0, 0.0, 0.0, 1.0]


def test_rewards_that_need_a_target_leave_a_group_without_one_unscored():
    # an invalid completion (-1) must not match NO_TARGET (-1)
    items, targets = [3, -1, 5, 3], [NO_TARGET, NO_TARGET, 5, 5]
    assert rule_reward(["x"] * 4, completion_item=items, target_index=targets) == [
        None,
        None,
        1.0,
        0.0,
    ]
    ranked = ranking_reward(
        ["x"] * 4, completion_item=items, target_index=targets, rank=[0, 1, 0, 1], num_generations=2
    )
    assert ranked == [None, None, 1.0, rank_penalties(2)[1]]
    emb = np.eye(6, dtype=np.float32)
    semantic = SemanticReward(embeddings=emb)(
        ["x"] * 4, completion_item=items, target_index=targets
    )
    assert semantic == [None, None, 1.0, 0.0]


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


def test_with_positives_the_users_next_items_count_as_right():
    # grpo.horizon: row 0's positives are its target 2 and the user's next item 9
    columns = {"target_index": [2, 2, 2, 5, 5, 5], "positive_index": [[2, 9]] * 3 + [[5, 4]] * 3}
    items = [7, 2, 9, 1, 6, 3]
    assert rule_reward(["x"] * 6, completion_item=items, **columns) == [0, 1, 1, 0, 0, 0]
    p = rank_penalties(3)
    ranked = ranking_reward(
        ["x"] * 6, completion_item=items, rank=[0, 1, 2] * 2, num_generations=3, **columns
    )
    assert ranked[:3] == [p[0], 1.0, 1.0]
    # a group holding only a later positive (4) is a group with a right answer
    ranked = ranking_reward(
        ["x"] * 3,
        completion_item=[4, 1, 6],
        rank=[0, 1, 2],
        num_generations=3,
        target_index=[5] * 3,
        positive_index=[[5, 4]] * 3,
    )
    assert ranked == [1.0, p[1], p[2]]
    # without the column the target alone is right, as before
    assert rule_reward(["x"] * 3, completion_item=[2, 9, 7], target_index=[2] * 3) == [1, 0, 0]


def test_semantic_reward_is_cosine_similarity_to_the_target():
    emb = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=np.float32)
    reward = SemanticReward(embeddings=emb)
    out = reward(["x"] * 3, completion_item=[0, 1, -1], target_index=[2, 2, 2])
    assert out[0] == pytest.approx(1 / math.sqrt(2)) and out[1] == pytest.approx(1 / math.sqrt(2))
    assert out[2] is None  # not an item: unscorable


def _collaborative_reward() -> CollaborativeReward:
    """The collaborative reward of a random 6-item SASRec."""
    from models.baselines.sasrec import SASRec, SASRecConfig

    torch.manual_seed(0)
    config = SASRecConfig(hidden=8, heads=1, blocks=1, max_len=5)
    model = SASRec(item_ids=[f"i{n}" for n in range(6)], config=config)
    return CollaborativeReward(model=model, max_len=5)


def test_collaborative_reward_is_sasrec_probability_of_the_item():
    reward = _collaborative_reward()
    out = reward(["x"] * 6, completion_item=list(range(6)), history_index=[[0, 1]] * 6)
    assert sum(out) == pytest.approx(1.0, abs=1e-5)  # a distribution over the catalog
    assert all(0 < v < 1 for v in out)


def test_collaborative_reward_leaves_prompts_without_history_unscored():
    reward = _collaborative_reward()
    alone = reward(["x"] * 6, completion_item=list(range(6)), history_index=[[0, 1]] * 6)
    # a title→SID group (no history) next to a history group: only the latter is scored, as alone
    mixed = reward(
        ["x"] * 12, completion_item=list(range(6)) * 2, history_index=[[]] * 6 + [[0, 1]] * 6
    )
    assert mixed[:6] == [None] * 6
    assert mixed[6:] == pytest.approx(alone)
    assert reward(["x"] * 2, completion_item=[0, 1], history_index=[[], []]) == [None, None]


def test_non_finite_guard_counts_and_drops_nan_and_inf():
    logged = {}
    guard = NonFiniteGuard(lambda completions, **_: [1.0, math.nan, math.inf, None], "flaky")
    out = guard(["a"] * 4, log_metric=lambda name, v: logged.__setitem__(name, v))
    assert out == [1.0, None, None, None]
    assert guard.count == 2 and logged == {"rewards/flaky/non_finite": 2.0}
    assert guard.__name__ == "flaky"


def test_group_rank_scales_each_groups_ranks_to_unit_range():
    raw = [0.01, 0.002, 0.03, 0.002, 5.0, math.nan, None, 1.0]
    ranked = GroupRank(lambda completions, **_: raw, num_generations=4)(["x"] * 8)
    assert ranked[:4] == [pytest.approx(2 / 3), pytest.approx(1 / 6), 1.0, pytest.approx(1 / 6)]
    assert ranked[4] == 1.0 and ranked[7] == 0.0  # ranked among the group's finite values
    assert math.isnan(ranked[5]) and ranked[6] is None  # left for NonFiniteGuard / TRL
    single = GroupRank(lambda completions, **_: [None, 0.3], num_generations=2)(["x"] * 2)
    assert single == [None, 0.5]


def _advantages(rewards: np.ndarray, g: int, scale: str) -> np.ndarray:
    """TRL's GRPO advantages: summed weighted rewards minus the group mean, optionally divided
    by the group's std."""
    grouped = rewards.reshape(-1, g)
    adv = grouped - grouped.mean(1, keepdims=True)
    if scale == "group":
        adv = adv / (grouped.std(1, ddof=1, keepdims=True) + 1e-4)
    return adv.reshape(-1)


def _worst_case(cfg: GrpoConfig, seed: int) -> tuple[float, float]:
    """(largest |advantage| in a group missing the target, the target's advantage in a group
    holding it) for random SASRec probabilities, the target the least probable in its group."""
    g = cfg.num_generations
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(g * 2, 0.3)).tolist()
    target_rank = int(rng.integers(g))
    items = list(range(g * 2))
    targets = [items[target_rank]] * g + [2 * g] * g  # group 0 holds its target, group 1 misses
    probs[target_rank] = min(probs[:g]) / 2  # SASRec finds the target least plausible
    ranks = list(range(g)) * 2
    collab = lambda completions, **_: probs  # noqa: E731
    dense = GroupRank(collab, g) if cfg.reward_form == "rank" else collab
    w = cfg.rewards
    total = w.ranking * np.array(
        ranking_reward(
            ["x"] * 2 * g,
            completion_item=items,
            target_index=targets,
            rank=ranks,
            num_generations=g,
        )
    ) + w.collaborative * np.array(dense(["x"] * 2 * g))
    adv = _advantages(total, g, cfg.scale_rewards)
    return float(np.abs(adv[g:]).max()), float(adv[target_rank])


@pytest.mark.parametrize("seed", range(20))
def test_default_rewards_keep_the_target_signal_on_top(seed):
    missing, target = _worst_case(GrpoConfig(), seed)
    assert missing < target


def test_raw_group_scaled_rewards_let_sasrec_drown_the_target():
    # the configuration before: every missing group gets unit-variance SASRec advantages
    before = GrpoConfig(reward_form="raw", scale_rewards="group", rewards={"collaborative": 1.0})
    results = [_worst_case(before, seed) for seed in range(20)]
    assert any(missing > target for missing, target in results)


def test_sid_regex_matches_exactly_the_catalog():
    sids = ["<a_1><b_2>", "<a_1><b_3>", "<a_10><b_2>"]
    pattern = re.compile(sid_regex(sids))
    assert all(pattern.fullmatch(s) for s in sids)
    for other in ("<a_1><b_1>", "<a_10><b_3>", "<a_1>", "<a_1><b_2><c_0>"):
        assert not pattern.fullmatch(other)


def test_ease_reward_is_the_items_score_after_its_own_history(split_rows):
    from models.baselines.ease import EASE
    from models.rewards import EaseReward

    item_ids = [f"i{i}" for i in range(20)]

    sequences = {
        f"u{n}": ["i0", "i1", "i5", "i6"] if n % 2 else ["i2", "i3", "i5", "i6"] for n in range(10)
    }
    model = EASE(item_ids=item_ids).fit(split_rows(sequences, 5)["train"])
    reward = EaseReward(model=model)
    # two groups with their own histories, and a title→SID group (no history) between them
    out = reward(
        ["x"] * 6,
        completion_item=[1, 3, 1, 3, 1, -1],
        history_index=[[0], [0], [], [], [2], [2]],
    )
    expected = model.scores([[0], [2]])
    assert out[0] == pytest.approx(expected[0, 1]) and out[1] == pytest.approx(expected[0, 3])
    assert out[0] > out[1]  # i1 goes with i0
    assert out[2:4] == [None, None]
    assert out[4] == pytest.approx(expected[1, 1])
    assert out[5] is None  # not an item
