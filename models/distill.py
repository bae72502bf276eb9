"""SASRec as a teacher for the SID language model: soft targets for every SID token of the
sequence windows (``sft.distill``).

For each item of a training window that has history before it, the ``baselines`` stage's
SASRec ranks the full catalog from the items before it in that window (its last ``max_len``),
the window's earlier items removed, as evaluation removes seen items. The item distribution
becomes one target distribution per SID place: at place ``l`` it is SASRec's probability mass
of every next code among the items that share the true item's first ``l`` codes (the prefix the
model is fed, teacher forcing), renormalized. The model's log-probabilities at that place (over
its whole vocabulary) are scored against it with cross-entropy, added to the usual loss with
the weight ``sft.distill``. Alignment pairs, terminators and items without history keep the
plain loss only.

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
    """Soft targets for some token places of a batch."""

    rows: torch.Tensor
    """(P,) batch row of each place."""
    columns: torch.Tensor
    """(P,) column whose logits predict the place's token (the column before it)."""
    probs: torch.Tensor
    """(P, vocabulary) the teacher's distribution over the token at that place."""


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
    ):
        """``item_tokens``: (items, L) SID token ids in SASRec's catalog order (row i is
        ``sasrec.item_ids[i]``)."""
        super().__init__(item_tokens, bos_token_id)
        if len(item_tokens) != sasrec.n_items:
            raise ValueError(
                f"{len(item_tokens)} SIDs for a SASRec catalog of {sasrec.n_items} items"
            )
        self.sasrec = sasrec
        self.weight = weight
        self.temperature = temperature
        self.item_of = {tuple(t): i for i, t in enumerate(item_tokens.tolist())}
        self.max_len: int = sasrec.config.max_len

    def _places(self, inputs: dict[str, Any]) -> tuple[list[tuple[int, int]], list[list[int]], list[int]]:
        """(row, first SID column) of every window item that has history and is a target,
        its history (item indices, oldest first) and the item itself."""
        ids, labels = inputs["input_ids"], inputs["labels"]
        length = self.item_tokens.shape[1]
        places, histories, targets = [], [], []
        for row, _, end, starts in self.windows(inputs):
            items = [
                self.item_of.get(tuple(ids[row, s : s + length].tolist()), -1)
                if s + length <= end
                else -1
                for s in starts
            ]
            for j in range(1, len(starts)):
                s = starts[j]
                if items[j] < 0 or labels[row, s] == -100 or min(items[:j]) < 0:
                    continue
                places.append((row, s))
                histories.append(items[:j])
                targets.append(items[j])
        return places, histories, targets

    @torch.no_grad()
    def targets(self, inputs: dict[str, Any], vocabulary: int) -> TeacherTargets | None:
        """The teacher's targets for every SID token of the batch's window items (None: none)."""
        from models.baselines.sasrec import _pad_left

        places, histories, targets = self._places(inputs)
        if not places:
            return None
        device = inputs["input_ids"].device
        with self.sasrec.inference():
            seqs = _pad_left(histories, self.max_len).to(next(self.sasrec.parameters()).device)
            scores = self.sasrec.scores(self.sasrec(seqs)[:, -1]).float().cpu()
        for p, history in enumerate(histories):  # seen items are never recommended
            scores[p, history] = float("-inf")
        probs = (scores / self.temperature).softmax(-1)
        codes = self.item_tokens  # (items, L)
        target_codes = codes[torch.tensor(targets)]  # (P, L)
        match = torch.ones_like(probs, dtype=torch.bool)
        rows, columns, dists = [], [], []
        place_rows = torch.tensor([r for r, _ in places])
        place_cols = torch.tensor([s for _, s in places])
        for level in range(codes.shape[1]):
            if level:
                match &= codes[:, level - 1][None, :] == target_codes[:, level - 1][:, None]
            mass = torch.zeros(len(places), vocabulary)
            mass.scatter_add_(1, codes[:, level].expand(len(places), -1), probs * match)
            total = mass.sum(-1, keepdim=True)
            keep = total.squeeze(-1) > 0  # the true prefix holds only seen items: no target
            rows.append(place_rows[keep])
            columns.append(place_cols[keep] + level - 1)
            dists.append(mass[keep] / total[keep])
        return TeacherTargets(
            rows=torch.cat(rows).to(device),
            columns=torch.cat(columns).to(device),
            probs=torch.cat(dists).to(device),
        )

    def loss(self, logits: torch.Tensor, targets: TeacherTargets) -> torch.Tensor:
        """Mean cross-entropy of the model's next-token distributions against the teacher's."""
        logp = F.log_softmax(logits[targets.rows, targets.columns].float(), dim=-1)
        return -(targets.probs * logp).sum(-1).mean()
