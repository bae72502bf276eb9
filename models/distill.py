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
was, which the hard target alone never shows. SASRec is read, never trained here. With
``sft.distill_ease`` > 0 the teacher's item scores are SASRec's blended with EASE's
(``models/baselines/ease.py``, :func:`~models.baselines.ease.blend`), a second model of the same
train rows that ranks better with SASRec than either alone (docs/benchmarks.md, experiment
index: "SASRec blended with EASE").
"""

from __future__ import annotations

from collections import OrderedDict
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


class _RowPlaces(NamedTuple):
    """The places of one batch row: its window items that have history and are targets."""

    columns: torch.Tensor
    """(P,) the column of each item's first SID token."""
    targets: torch.Tensor
    """(P,) the item (catalog row)."""
    seen: torch.Tensor
    """(P, longest history) the items before it in its window, padded with the catalog size."""
    keys: list[tuple[int, ...]]
    """SASRec's input at each place: the history's last ``max_len`` items."""
    nexts: list[list[int]]
    """The item and the window's next ``horizon`` − 1 items."""


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
        ease: Any = None,
        ease_weight: float = 0.0,
        cached_rows: int = 4096,
    ):
        """``item_tokens``: (items, L) SID token ids in SASRec's catalog order (row i is
        ``sasrec.item_ids[i]``). ``future``: the share of each item distribution moved evenly
        onto the target and the window's next ``horizon`` − 1 items (0: SASRec's alone).
        ``ease``: a fitted :class:`models.baselines.ease.EASE` over the same catalog order,
        blended into SASRec's scores with weight ``ease_weight``
        (:func:`models.baselines.ease.blend`; None: SASRec alone).
        ``cached_rows``: how many batch rows' places are kept for the next epoch (the least
        recently seen go first; MovieLens's SFT has ~2,100 packed rows, each a few tens of KB)."""
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
        if ease is not None and ease.item_ids != [str(i) for i in sasrec.item_ids]:
            raise ValueError("EASE and SASRec must score the same catalog in the same order")
        self.ease = ease
        self.ease_weight = ease_weight
        self.item_of = {tuple(t): i for i, t in enumerate(item_tokens.tolist())}
        self.max_len: int = sasrec.config.max_len
        self.levels = [_Level.of(item_tokens, level) for level in range(item_tokens.shape[1])]
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}
        self._rows_cache: OrderedDict[bytes, _RowPlaces] = OrderedDict()
        self.cached_rows = cached_rows

    def _states(self, keys: list[tuple[int, ...]]) -> torch.Tensor:
        """(P, hidden) SASRec's last state after each input (a history's last ``max_len``
        items), encoded once per distinct input: the windows come back every epoch."""
        from models.baselines.sasrec import _pad_left

        new = [k for k in dict.fromkeys(keys) if k not in self._cache]
        if new:
            device = next(self.sasrec.parameters()).device
            with self.sasrec.inference():
                states = self.sasrec(_pad_left(new, self.max_len).to(device))[:, -1]
            self._cache.update(zip(new, states, strict=True))
        return torch.stack([self._cache[k] for k in keys])

    def _row_places(
        self, row_ids: torch.Tensor, row_labels: torch.Tensor, row_positions: torch.Tensor
    ) -> _RowPlaces:
        """The places of one row: every window item that has history and is a target."""
        length = self.item_tokens.shape[1]
        ids, labels = row_ids.tolist(), row_labels.tolist()
        columns, histories, targets, nexts = [], [], [], []
        one_row = {"input_ids": row_ids[None], "position_ids": row_positions[None]}
        for _, _, end, starts in self.windows(one_row):
            items = [
                self.item_of.get(tuple(ids[s : s + length]), -1) if s + length <= end else -1
                for s in starts
            ]
            # an item that is not in the catalog (or cut off) leaves no history after it
            known = next((j for j, item in enumerate(items) if item < 0), len(items))
            for j in range(1, known):
                if labels[starts[j]] == -100:
                    continue
                columns.append(starts[j])
                histories.append(items[:j])
                targets.append(items[j])
                nexts.append(items[j : min(j + self.horizon, known)])
        # seen items are scattered out of SASRec's scores; the catalog size pads (an extra column)
        width, pad = max(map(len, histories), default=0), len(self.item_tokens)
        return _RowPlaces(
            columns=torch.tensor(columns, dtype=torch.long),
            targets=torch.tensor(targets, dtype=torch.long),
            seen=torch.tensor(
                [h + [pad] * (width - len(h)) for h in histories], dtype=torch.long
            ).reshape(len(histories), width),
            keys=[tuple(h[-self.max_len :]) for h in histories],
            nexts=nexts,
        )

    def _rows(self, inputs: dict[str, Any]) -> list[_RowPlaces]:
        """Every row's places, each row read once: the same packed rows come back every epoch,
        padded to other widths. A row is known by its tokens, labels and positions up to its
        last labelled token (nothing after it can be a place or precede one)."""
        ids, labels = inputs["input_ids"].cpu(), inputs["labels"].cpu()
        positions = inputs.get("position_ids")
        if positions is None:  # one example per row
            positions = torch.arange(ids.shape[1]).expand_as(ids)
        positions = positions.cpu()
        labelled = labels != -100
        ends = torch.where(
            labelled.any(1), ids.shape[1] - labelled.flip(1).int().argmax(1), 0
        ).tolist()
        rows = [(ids[r, :n], labels[r, :n], positions[r, :n]) for r, n in enumerate(ends)]
        keys = [b"|".join(t.numpy().tobytes() for t in row) for row in rows]
        found = {key: self._rows_cache[key] for key in keys if key in self._rows_cache}
        for key in found:
            self._rows_cache.move_to_end(key)
        for key, (row_ids, row_labels, row_positions) in zip(keys, rows, strict=True):
            if key not in found:
                found[key] = self._row_places(row_ids, row_labels, row_positions)
                self._rows_cache[key] = found[key]
        while len(self._rows_cache) > self.cached_rows:
            self._rows_cache.popitem(last=False)
        return [found[key] for key in keys]

    @torch.no_grad()
    def targets(self, inputs: dict[str, Any]) -> list[TeacherTargets]:
        """The teacher's targets for every SID token of the batch's window items, one entry per
        SID level (empty: no window item with history)."""
        rows = self._rows(inputs)
        places = sum(len(r.targets) for r in rows)
        if not places:
            return []
        device = inputs["input_ids"].device
        keys = [key for r in rows for key in r.keys]
        scores = self.sasrec.scores(self._states(keys)).float().cpu()
        if self.ease is not None and self.ease_weight > 0:
            from models.baselines.ease import blend

            ease = torch.from_numpy(self.ease.encoded_inputs(keys) @ self.ease.weights)
            scores = blend(scores, ease, self.ease_weight)
        # seen items (the window's earlier items) are never recommended: an extra column takes
        # the padding of the histories
        width, pad = max(r.seen.shape[1] for r in rows), scores.shape[1]
        seen = torch.cat([F.pad(r.seen, (0, width - r.seen.shape[1]), value=pad) for r in rows])
        scores = torch.cat([scores, torch.zeros(places, 1)], 1)
        scores = scores.scatter(1, seen, float("-inf"))[:, :-1]
        probs = (scores / self.temperature).softmax(-1)
        if self.future > 0:  # part of the mass onto the burst the target sits in
            burst = torch.zeros_like(probs)
            for p, items in enumerate(n for r in rows for n in r.nexts):
                burst[p, items] = 1.0 / len(items)
            probs = (1 - self.future) * probs + self.future * burst
        probs = torch.cat([probs, torch.zeros(places, 1)], 1)  # the members' padding
        target = torch.cat([r.targets for r in rows])
        place_rows = torch.cat([torch.full_like(r.targets, n) for n, r in enumerate(rows)])
        place_cols = torch.cat([r.columns for r in rows])
        out = []
        for level, lookup in enumerate(self.levels):
            # the items that share the true item's codes before this level, by their code here
            members = lookup.members[lookup.group[target]]  # (P, largest group)
            mass = torch.zeros(places, len(lookup.tokens))
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
