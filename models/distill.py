"""SASRec as a teacher for the SID language model: soft targets for every SID token of the
sequence windows (``sft.distill``).

For each item of a training window that has history before it, the ``baselines`` stage's
SASRec ranks the full catalog from the items before it in that window (its last ``max_len``),
the window's earlier items removed, as evaluation removes seen items. The item distribution
becomes one target distribution per SID place: at place ``l`` it is SASRec's probability mass
of every next code among the items that share the true item's first ``l`` codes (the prefix the
model is fed, teacher forcing), renormalized. The model's distribution at that place over the
same level's SID tokens (its logits of those tokens, renormalized: the hard target already
teaches which tokens may come there) is scored against it with cross-entropy, added to the
usual loss with the weight ``sft.distill``. Alignment pairs, terminators and items without
history keep the plain loss only. With ``sft.distill_future`` > 0 that share of the item
distribution is moved, evenly, onto the true item and the window's next
``sft.distill_horizon`` − 1 items before it is split by place: users rate in bursts, and the
next item is one of them in the order they were entered.

This is knowledge distillation (Hinton et al. 2015) into a model that generates items token by
token: the hard target says which item came next, the teacher how plausible every other item
was, which the hard target alone never shows. SASRec is read, never trained here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from models.sft_trainer import _WindowItems


class TeacherTargets(NamedTuple):
    """Soft targets for the token places of one SID level in a batch."""

    rows: torch.Tensor
    """(P,) batch row of each place."""
    columns: torch.Tensor
    """(P,) column whose logits predict the place's token (the column before it)."""
    tokens: torch.Tensor
    """(K,) the level's token ids: the vocabulary the targets spread over."""
    probs: torch.Tensor
    """(P, K) the teacher's distribution over those tokens at each place."""


class _Level(NamedTuple):
    """One SID level's lookup tables: which items share a prefix, and their codes' columns."""

    tokens: torch.Tensor
    """(K,) the level's token ids in use."""
    column: torch.Tensor
    """(items + 1,) each item's token as a column of ``tokens`` (the last row: padding, 0)."""
    group: torch.Tensor
    """(items,) the prefix group of each item: the items sharing its codes before this level."""
    members: torch.Tensor
    """(groups, largest group) the items of each group, padded with ``items`` (a zero column)."""

    @classmethod
    def of(cls, item_tokens: torch.Tensor, level: int) -> _Level:
        n = len(item_tokens)
        tokens, column = torch.unique(item_tokens[:, level], return_inverse=True)
        if level == 0:  # one group: the whole catalog
            group = torch.zeros(n, dtype=torch.long)
        else:
            group = torch.unique(item_tokens[:, :level], dim=0, return_inverse=True)[1]
        size = torch.bincount(group)
        order = torch.argsort(group, stable=True)
        rank = torch.arange(n) - torch.repeat_interleave(torch.cumsum(size, 0) - size, size)
        members = torch.full((len(size), int(size.max())), n)
        members[group[order], rank] = order
        return cls(tokens, torch.cat([column, torch.zeros(1, dtype=torch.long)]), group, members)


class SasrecTeacher(_WindowItems):
    """Soft SID-token targets from a trained SASRec for the sequence windows of a batch."""

    def __init__(
        self,
        sasrec: Any,
        item_tokens: torch.Tensor,
        *,
        bos_token_id: int,
        weight: float,
        temperature: float = 1.0,
        future: float = 0.0,
        horizon: int = 1,
    ):
        """``item_tokens``: (items, L) SID token ids in SASRec's catalog order (row i is
        ``sasrec.item_ids[i]``). ``future``: the share of each item distribution moved evenly
        onto the target and the window's next ``horizon`` − 1 items (0: SASRec's alone)."""
        super().__init__(item_tokens, bos_token_id)
        if len(item_tokens) != sasrec.n_items:
            raise ValueError(
                f"{len(item_tokens)} SIDs for a SASRec catalog of {sasrec.n_items} items"
            )
        self.sasrec = sasrec
        self.weight = weight
        self.temperature = temperature
        self.future = future
        self.horizon = horizon
        self.item_of = {tuple(t): i for i, t in enumerate(item_tokens.tolist())}
        self.max_len: int = sasrec.config.max_len
        self.levels = [_Level.of(item_tokens, level) for level in range(item_tokens.shape[1])]
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def _states(self, histories: list[list[int]]) -> torch.Tensor:
        """(P, hidden) SASRec's last state after each history's last ``max_len`` items, encoded
        once per distinct input: the windows come back every epoch."""
        from models.baselines.sasrec import _pad_left

        keys = [tuple(h[-self.max_len :]) for h in histories]
        new = [k for k in dict.fromkeys(keys) if k not in self._cache]
        if new:
            device = next(self.sasrec.parameters()).device
            with self.sasrec.inference():
                states = self.sasrec(_pad_left(new, self.max_len).to(device))[:, -1]
            self._cache.update(zip(new, states, strict=True))
        return torch.stack([self._cache[k] for k in keys])

    def _places(
        self, inputs: dict[str, Any]
    ) -> tuple[list[tuple[int, int]], list[list[int]], list[int], list[list[int]]]:
        """(row, first SID column) of every window item that has history and is a target,
        its history (item indices, oldest first), the item itself, and the item with the
        window's next ``horizon`` − 1 items (fewer at the window's end)."""
        # read token by token: as Python lists, one conversion per row (not per item)
        ids, labels = inputs["input_ids"].tolist(), inputs["labels"].tolist()
        length = self.item_tokens.shape[1]
        places, histories, targets, nexts = [], [], [], []
        for row, _, end, starts in self.windows(inputs):
            row_ids = ids[row]
            items = [
                self.item_of.get(tuple(row_ids[s : s + length]), -1) if s + length <= end else -1
                for s in starts
            ]
            # an item that is not in the catalog (or cut off) leaves no history after it
            known = next((j for j, item in enumerate(items) if item < 0), len(items))
            for j in range(1, known):
                s = starts[j]
                if labels[row][s] == -100:
                    continue
                places.append((row, s))
                histories.append(items[:j])
                targets.append(items[j])
                nexts.append(items[j : min(j + self.horizon, known)])
        return places, histories, targets, nexts

    @torch.no_grad()
    def targets(self, inputs: dict[str, Any]) -> list[TeacherTargets]:
        """The teacher's targets for every SID token of the batch's window items, one entry per
        SID level (empty: no window item with history)."""
        places, histories, targets, nexts = self._places(inputs)
        if not places:
            return []
        device = inputs["input_ids"].device
        scores = self.sasrec.scores(self._states(histories)).float().cpu()
        # seen items (the window's earlier items) are never recommended: an extra column takes
        # the padding of the histories
        width, pad = max(map(len, histories)), scores.shape[1]
        seen = torch.tensor([history + [pad] * (width - len(history)) for history in histories])
        scores = torch.cat([scores, torch.zeros(len(places), 1)], 1)
        scores = scores.scatter(1, seen, float("-inf"))[:, :-1]
        probs = (scores / self.temperature).softmax(-1)
        if self.future > 0:  # part of the mass onto the burst the target sits in
            burst = torch.zeros_like(probs)
            for p, items in enumerate(nexts):
                burst[p, items] = 1.0 / len(items)
            probs = (1 - self.future) * probs + self.future * burst
        probs = torch.cat([probs, torch.zeros(len(places), 1)], 1)  # the members' padding
        target = torch.tensor(targets)
        place_rows = torch.tensor([r for r, _ in places])
        place_cols = torch.tensor([s for _, s in places])
        out = []
        for level, lookup in enumerate(self.levels):
            # the items that share the true item's codes before this level, by their code here
            members = lookup.members[lookup.group[target]]  # (P, largest group)
            mass = torch.zeros(len(places), len(lookup.tokens))
            mass.scatter_add_(1, lookup.column[members], probs.gather(1, members))
            total = mass.sum(-1, keepdim=True)
            keep = total.squeeze(-1) > 0  # the true prefix holds only seen items: no target
            out.append(
                TeacherTargets(
                    rows=place_rows[keep].to(device),
                    columns=(place_cols[keep] + level - 1).to(device),
                    tokens=lookup.tokens.to(device),
                    probs=(mass[keep] / total[keep]).to(device),
                )
            )
        return out

    def loss(
        self,
        targets: list[TeacherTargets],
        logits: torch.Tensor | None,
        *,
        states: torch.Tensor | None = None,
        head: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean cross-entropy, over every place, of the teacher's distribution against the
        model's next-token distribution over the same level's SID tokens.

        With ``states`` (the final hidden states the logits were computed from) and ``head``
        (the output layer's weight; no bias) the same logits are recomputed from the level's
        rows of the weight only: the full logits then get no second gradient, which on a CPU
        costs more than the rest of the teacher; ``logits`` may then be None (never computed)."""
        scored = states if states is not None and head is not None else logits
        if scored is None:
            raise ValueError("the teacher's loss needs the logits, or the states and the head")
        total, places = scored.new_zeros((), dtype=torch.float32), 0
        for t in targets:
            flat = t.rows * scored.shape[1] + t.columns
            if states is not None and head is not None:
                # in the weight's dtype, whatever mixed precision made of the states
                picked = (
                    states.flatten(0, 1).index_select(0, flat).to(head.dtype) @ head[t.tokens].T
                )
            else:
                assert logits is not None
                picked = logits.flatten(0, 1).index_select(0, flat).index_select(1, t.tokens)
            total = total - (t.probs * F.log_softmax(picked.float(), dim=-1)).sum()
            places += len(t.rows)
        return total / max(places, 1)
