"""Rewards for GRPO over semantic IDs, each a plain callable with TRL's reward signature.

TRL calls ``reward(prompts=..., completions=..., completion_ids=..., **columns)`` where
``columns`` are the dataset's columns repeated per completion. The rollout step of
:class:`models.grpo_trainer.SidGRPOTrainer` adds two more: ``completion_item`` (the catalog
row of the generated SID, -1 if it is not an item) and ``rank`` (its place in the group, 0 =
best beam). Targets come per sample from the ``target_index`` column, never from a
prompt → target lookup (users with identical histories have different targets).

A reward returns one float per completion, or None where it cannot score one (TRL treats
None as NaN and leaves it out of the group baseline).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

RewardFunc = Callable[..., list[float | None]]

NO_TARGET = -1
"""``target_index`` of a prompt without a target (``grpo.frontier_prompts``): the rewards that
need one leave its completions unscored (None)."""

DENSE_REWARDS = ("collaborative", "ease", "semantic")
"""Rewards that score every completion on a continuous scale (``grpo.reward_form`` ranks them
within the group); rule and ranking are already bounded by the target's 1."""


def hits(
    completion_item: Sequence[int],
    target_index: Sequence[int],
    positive_index: Sequence[Sequence[int]] | None = None,
) -> list[bool]:
    """Per completion, whether it is a right answer: the target item, or any item of its row's
    ``positive_index`` (the target and the user's next train items, ``grpo.horizon``) where
    the dataset has that column."""
    if positive_index is None:
        return [item == target for item, target in zip(completion_item, target_index, strict=True)]
    return [item in set(p) for item, p in zip(completion_item, positive_index, strict=True)]


def rule_reward(
    completions: Sequence[Any],
    *,
    completion_item: Sequence[int],
    target_index: Sequence[int],
    positive_index: Sequence[Sequence[int]] | None = None,
    **_: Any,
) -> list[float | None]:
    """1 for a right answer (the target, or one of ``positive_index``), else 0; None without a
    target."""
    right = hits(completion_item, target_index, positive_index)
    return [
        float(hit) if target != NO_TARGET else None
        for hit, target in zip(right, target_index, strict=True)
    ]


def rank_penalties(num_generations: int) -> list[float]:
    """MiniOneRec's NDCG-style weights for wrong items: -(1/log2(r+2)) normalized over the
    group, so a wrong item at the top of the beam costs most and the penalties sum to -1."""
    weights = [1.0 / math.log2(r + 2) for r in range(num_generations)]
    total = sum(weights)
    return [-w / total for w in weights]


def ranking_reward(
    completions: Sequence[Any],
    *,
    completion_item: Sequence[int],
    target_index: Sequence[int],
    rank: Sequence[int],
    num_generations: int,
    positive_index: Sequence[Sequence[int]] | None = None,
    **_: Any,
) -> list[float | None]:
    """Rank-aware reward (MiniOneRec's ``ranking``): the rule reward, plus, in a group that
    contains a right answer, a penalty for each wrong item by its beam rank. A group with no
    right answer gets 0 everywhere (no signal to rank against); a group without a target None."""
    penalty = rank_penalties(num_generations)
    right = hits(completion_item, target_index, positive_index)
    rewards: list[float | None] = []
    for start in range(0, len(right), num_generations):
        group = slice(start, start + num_generations)
        if target_index[start] == NO_TARGET:
            rewards += [None] * len(right[group])
            continue
        found = any(right[group])
        for hit, r in zip(right[group], rank[group], strict=True):
            rewards.append(1.0 if hit else (penalty[min(r, num_generations - 1)] if found else 0.0))
    return rewards


def score_per_history(
    score: Callable[[list[tuple[int, ...]]], np.ndarray],
    completion_item: Sequence[int],
    history_index: Sequence[Sequence[int]],
) -> list[float | None]:
    """Each completion's item looked up in ``score(histories)`` (one row of catalog scores per
    history) for its own history. Rows of one group share a history, so each distinct one is
    scored once; an empty one (a title→SID prompt, ``grpo.title_prompts``) has nothing to read
    and is left unscored (None), as is a completion that is not an item."""
    keys = [tuple(h) for h in history_index]
    unique = [key for key in dict.fromkeys(keys) if key]
    if not unique:
        return [None] * len(keys)
    scores = score(unique)
    row = {key: i for i, key in enumerate(unique)}
    return [
        float(scores[row[key], item]) if item >= 0 and key else None
        for key, item in zip(keys, completion_item, strict=True)
    ]


class CollaborativeReward:
    """The SASRec baseline's probability of the generated item given the user's history
    (softmax over the full catalog), so the policy is pulled towards collaboratively
    plausible items even when it misses the exact target; None for a prompt without history."""

    __name__ = "collaborative_reward"

    def __init__(self, *, model: Any, max_len: int):
        """``model``: a trained :class:`models.baselines.sasrec.SASRec` (catalog order = item row)."""
        self.model = model
        self.max_len = max_len

    def __call__(
        self,
        completions: Sequence[Any],
        *,
        completion_item: Sequence[int],
        history_index: Sequence[Sequence[int]],
        **_: Any,
    ) -> list[float | None]:
        from models.baselines.sasrec import _pad_left

        def probabilities(histories: list[tuple[int, ...]]) -> np.ndarray:
            device = next(self.model.parameters()).device
            with self.model.inference():
                hidden = self.model(_pad_left(histories, self.max_len).to(device))[:, -1]
                return self.model.scores(hidden).float().softmax(-1).cpu().numpy()

        return score_per_history(probabilities, completion_item, history_index)


class EaseReward:
    """EASE's score of the generated item after the user's history read by recency
    (:class:`models.baselines.ease.EASE`, fitted on the train split): the catalog's item-to-item
    co-occurrences, which the SASRec reward only carries in part; None for a prompt without
    history."""

    __name__ = "ease_reward"

    def __init__(self, *, model: Any):
        """``model``: a fitted :class:`models.baselines.ease.EASE` (catalog order = item row)."""
        self.model = model

    def __call__(
        self,
        completions: Sequence[Any],
        *,
        completion_item: Sequence[int],
        history_index: Sequence[Sequence[int]],
        **_: Any,
    ) -> list[float | None]:
        return score_per_history(self.model.scores, completion_item, history_index)


class SemanticReward:
    """Cosine similarity between the generated and the target item's text embeddings
    (``item_emb.npy``: L2-normalized, row i = catalog item i), so near misses score above
    unrelated items; None without a target."""

    __name__ = "semantic_reward"

    def __init__(self, *, embeddings: np.ndarray):
        emb = torch.as_tensor(np.asarray(embeddings, dtype=np.float32))
        self.embeddings = torch.nn.functional.normalize(emb, dim=1)

    def __call__(
        self,
        completions: Sequence[Any],
        *,
        completion_item: Sequence[int],
        target_index: Sequence[int],
        **_: Any,
    ) -> list[float | None]:
        items = torch.as_tensor(list(completion_item))
        targets = torch.as_tensor(list(target_index))
        valid = (items >= 0) & (targets != NO_TARGET)
        sims = (self.embeddings[items.clamp(min=0)] * self.embeddings[targets.clamp(min=0)]).sum(1)
        return [
            float(s) if ok else None for s, ok in zip(sims.tolist(), valid.tolist(), strict=True)
        ]


class GroupRank:
    """A dense reward bounded within each group: a completion's value becomes its rank among the
    group's finite values, scaled to [0, 1] (1 = the group's highest, 0 = its lowest, ties share
    their mean rank). Non-finite values pass through untouched (:class:`NonFiniteGuard` drops
    them).

    Raw collaborative probabilities are tiny yet span every group;
    scaled to unit variance per group they set most advantages. Ranked, they add at most
    ``weight / 2`` to any advantage (with ``scale_rewards: none``), below the target's +1 from
    the rule and ranking rewards."""

    def __init__(self, func: RewardFunc, num_generations: int):
        self.func = func
        self.num_generations = num_generations
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        from scipy.stats import rankdata

        values = self.func(*args, **kwargs)
        ranked: list[float | None] = list(values)
        for start in range(0, len(values), self.num_generations):
            rows = [
                i
                for i in range(start, min(start + self.num_generations, len(values)))
                if values[i] is not None and math.isfinite(values[i])  # type: ignore[arg-type]
            ]
            if not rows:
                continue
            ranks = rankdata([values[i] for i in rows])  # 1..n, ties averaged
            for i, r in zip(rows, ranks, strict=True):
                ranked[i] = float(r - 1) / (len(rows) - 1) if len(rows) > 1 else 0.5
        return ranked


class NonFiniteGuard:
    """Wraps a reward so NaN/inf values become None (left out of the group baseline by TRL
    instead of poisoning the step), counted in :attr:`count` and logged per call as
    ``rewards/<name>/non_finite``."""

    def __init__(self, func: RewardFunc, name: str):
        self.func = func
        self.__name__ = name
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        values = self.func(*args, **kwargs)
        cleaned = [v if v is None or math.isfinite(v) else None for v in values]
        bad = sum(v is not None and not math.isfinite(v) for v in values)
        self.count += bad
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            log_metric(f"rewards/{self.__name__}/non_finite", float(bad))
        return cleaned
