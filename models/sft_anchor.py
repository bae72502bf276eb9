"""The SFT loss as an anchor during GRPO (``grpo.sft_anchor``; InstructGPT's "PPO-ptx").

GRPO's update only sees its prompts' groups; nothing holds the model's predictions elsewhere
where SFT left them, and without an anchor the validation NDCG@10 dips below the SFT start
(docs/benchmarks.md, experiment index: "What GRPO's dip is"). The anchor adds, at every GRPO
step, the SFT language-model loss on a few of SFT's own training examples (the sequence
windows), weighted by ``grpo.sft_anchor``: the policy gradient moves the model, the anchor
pulls its next-item distributions back towards the data everywhere else (Ouyang et al. 2022
mixed the pretraining loss into PPO in the same way). A KL penalty (``grpo.beta``) instead
only constrains the sampled completions of the step's own prompts.

SFT's loss includes SASRec's soft targets when ``sft.distill`` is on (``models/distill.py``);
given that teacher, the anchor adds its term with SFT's weight, so the anchor is the loss SFT
minimized. Without it, more training on the token loss alone pulls the model off the balance
of hard and soft targets that SFT ended at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from models.prompts import Example


class SftAnchor:
    """Draws batches of SFT examples (prompt tokens carry no loss) and scores a model on them."""

    def __init__(
        self,
        examples: Sequence[Example],
        tokenizer: Any,
        *,
        weight: float,
        per_step: int,
        seed: int,
        teacher: Any = None,
    ):
        """``teacher``: a :class:`models.distill.SasrecTeacher` whose weighted term joins the
        token loss, as in SFT (None: the token loss alone)."""
        if not examples:
            raise ValueError("the SFT anchor needs at least one example")
        if weight <= 0 or per_step < 1:
            raise ValueError(f"weight must be > 0 and per_step >= 1, got {weight}, {per_step}")
        self.weight = weight
        self.per_step = per_step
        self.pad_token_id: int = tokenizer.pad_token_id
        self.rows: list[tuple[list[int], list[int]]] = []
        for ex in examples:
            prompt = tokenizer(ex.prompt, add_special_tokens=False)["input_ids"]
            completion = tokenizer(ex.completion, add_special_tokens=False)["input_ids"]
            self.rows.append((prompt + completion, [-100] * len(prompt) + completion))
        self.generator = torch.Generator().manual_seed(seed)
        self.teacher = teacher

    def batch(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """``per_step`` examples drawn without replacement (with it when there are fewer),
        right-padded: input ids, attention mask and labels (-100 on prompt and padding)."""
        n = len(self.rows)
        if self.per_step <= n:
            picks = torch.randperm(n, generator=self.generator)[: self.per_step]
        else:
            picks = torch.randint(n, (self.per_step,), generator=self.generator)
        chosen = [self.rows[i] for i in picks.tolist()]
        width = max(len(ids) for ids, _ in chosen)
        ids = torch.full((len(chosen), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(chosen), width), -100, dtype=torch.long)
        mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, (tokens, target) in enumerate(chosen):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            labels[row, : len(target)] = torch.tensor(target)
            mask[row, : len(tokens)] = 1
        return {
            "input_ids": ids.to(device),
            "attention_mask": mask.to(device),
            "labels": labels.to(device),
        }

    def loss(self, model: Any, device: torch.device | str) -> torch.Tensor:
        """SFT's loss on a fresh batch (unweighted by ``weight``): the mean token cross-entropy,
        plus the teacher's weighted term where there is a teacher."""
        batch = self.batch(device)
        outputs = model(**batch, use_cache=False)
        if self.teacher is None:
            return outputs.loss
        targets = self.teacher.targets(batch)
        if not targets:
            return outputs.loss
        return outputs.loss + self.teacher.weight * self.teacher.loss(targets, outputs.logits)
