"""TRL's SFTTrainer with the model's own loss where TRL's fused LM head does not pay off.

TRL computes the SFT loss through a fused, chunked LM head (``trl.kernels.chunked_logprob``)
that never materializes the logits: on a GPU with a large vocabulary that saves memory. On a
CPU the tiled projection and its hand-written backward cost more than they save: a step of the
tiny model (64 windows x 201 tokens) takes ~1.6x as long as with the model's own
cross-entropy (measured on 2 cores). :class:`SidSFTTrainer` keeps everything of TRL's trainer
(datasets, completion-only labels, logging, callbacks) and, on a CPU, computes the loss as
``transformers.Trainer`` does; TRL's entropy and token-accuracy logs are then not computed.

Batches stay randomly mixed: length-grouped batches (1.8x faster steps, as windows and short
alignment pairs no longer pad to each other) gave the alignment pairs whole optimizer steps of
their own, and the valid-selection NDCG@10 after 10 epochs fell from 0.109 to 0.056 (one run each).
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer
from trl import SFTTrainer


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
