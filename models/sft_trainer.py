"""TRL's SFTTrainer with the model's own loss where TRL's fused LM head does not pay off, and
batches of similar lengths in random order.

TRL computes the SFT loss through a fused, chunked LM head (``trl.kernels.chunked_logprob``)
that never materializes the logits: on a GPU with a large vocabulary that saves memory. On a
CPU the tiled projection and its hand-written backward cost more than they save: a step of the
tiny model (64 windows x 201 tokens) takes ~1.6x as long as with the model's own
cross-entropy (measured on 2 cores). :class:`SidSFTTrainer` keeps everything of TRL's trainer
(datasets, completion-only labels, logging, callbacks) and, on a CPU, computes the loss as
``transformers.Trainer`` does; TRL's entropy and token-accuracy logs are then not computed.

With ``train_sampling_strategy="group_by_length"`` the batches are transformers' length-grouped
batches (sequence windows of ~200 tokens and alignment pairs of ~20 no longer share a batch, so
little is padding: a step of the default mix took 1.26 s instead of 2.31 s), but in random batch
order: transformers sorts each mega-batch by length, which would feed all long examples and
then all short ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices
from trl import SFTTrainer


class ShuffledLengthGroupedSampler(LengthGroupedSampler):
    """Length-grouped batches of ``batch_size`` indices, the batches in random order (a short
    last batch stays last, so every other slice of ``batch_size`` is one batch)."""

    def __iter__(self) -> Iterator[int]:
        indices = get_length_grouped_indices(
            self.lengths, self.batch_size, generator=self.generator
        )
        size = self.batch_size
        batches = [indices[i : i + size] for i in range(0, len(indices), size)]
        last = [batches.pop()] if batches and len(batches[-1]) < size else []
        order = torch.randperm(len(batches), generator=self.generator).tolist()
        return iter([i for b in [*(batches[k] for k in order), *last] for i in b])


class SidSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose loss on a CPU is the model's own (``Trainer.compute_loss``)."""

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if self.args.device.type != "cpu":
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs["use_cache"] = False
        if model.training and "attention_mask" in inputs:  # TRL's num_tokens log
            self._total_train_tokens += int(inputs["attention_mask"].sum())
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        sampler = super()._get_train_sampler(train_dataset)
        if isinstance(sampler, LengthGroupedSampler):
            return ShuffledLengthGroupedSampler(
                sampler.batch_size, lengths=sampler.lengths, generator=sampler.generator
            )
        return sampler
