"""TRL's SFTTrainer with rows that hold several examples, and the model's own loss where TRL's
fused LM head does not pay off.

Packing (``SFTConfig(packing=True)``, TRL's ``bfd`` strategy) puts several examples into one row
of up to ``max_length`` tokens, so short alignment pairs fill the room a sequence window leaves
instead of each padding to the longest row of a batch. TRL then trains "padding-free": the whole
batch flattened into one row, which only FlashAttention runs efficiently; with SDPA or eager
attention (every CPU) the mask of a 64-row batch would be 64x the tokens of a row squared.
:class:`RowPackedCollator` keeps the rows instead: right-padded per row, position ids restarting
at every example and no attention mask, from which transformers builds a block-diagonal causal
mask per row (``masking_utils.find_packed_sequence_indices``), so an example never attends to
the one packed before it.

TRL computes the SFT loss through a fused, chunked LM head (``trl.kernels.chunked_logprob``)
that never materializes the logits: on a GPU with a large vocabulary that saves memory. On a
CPU the tiled projection and its hand-written backward cost more than they save (a slower
step than the model's own cross-entropy). :class:`SidSFTTrainer` keeps everything of TRL's trainer
(datasets, completion-only labels, logging, callbacks) and, on a CPU, computes the loss the
model would, through :func:`models.head_loss.head_cross_entropy` while training (the same loss
with fewer passes over the logits; the model's own loss where that cannot stand in: evaluation,
label smoothing, LoRA, several processes); TRL's entropy and token-accuracy logs are then not
computed.

Packing is how short and long examples share a step without padding: length-grouped batches
gave the alignment pairs whole optimizer steps of their own and the main task learned less,
while packed rows stay randomly mixed, and a packed epoch is shorter than an unpacked one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from transformers import Trainer
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from models.head_loss import head_cross_entropy
from models.shards import ShardRecord

PLAIN_HEAD_MODELS = frozenset({"qwen2", "llama"})
"""Model types whose logits are their output layer's output (the presets' tiny Qwen2 and
SmolLM2), which :func:`models.head_loss.head_cross_entropy` may compute."""


class RowPackedCollator(DataCollatorForLanguageModeling):
    """Batches of packed rows (TRL's ``seq_lengths``): per-row padding, position ids that restart
    at each example, no attention mask (transformers reads the examples from the position ids).

    Right padding needs no mask for a causal model: a row's real tokens never attend to the pads
    after them, and pads carry no labels."""

    def __init__(self, pad_token_id: int):
        super().__init__(pad_token_id=pad_token_id, return_position_ids=True)

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        del batch["attention_mask"]
        return batch


class _WindowItems:
    """Finds the items of the sequence windows in a training batch: examples whose first token
    after BOS is a first-level SID token (never the alignment pairs), their items starting at
    each first-level token."""

    def __init__(self, item_tokens: torch.Tensor, bos_token_id: int):
        self.item_tokens = item_tokens
        """(items, L) token ids of every catalog item's SID."""
        self.bos_token_id = bos_token_id
        self.first_level = torch.zeros(int(item_tokens.max()) + 1, dtype=torch.bool)
        self.first_level[item_tokens[:, 0]] = True

    def _is_first_level(self, ids: torch.Tensor) -> torch.Tensor:
        known = ids < len(self.first_level)
        return known & self.first_level[ids.clamp(max=len(self.first_level) - 1)]

    def windows(self, inputs: dict[str, Any]) -> Iterator[tuple[int, int, int, list[int]]]:
        """(row, start, end, item starts) of every window: ``start`` is its BOS, ``end`` the
        column after it."""
        ids = inputs["input_ids"].cpu()  # walked token by token: on a GPU, one copy first
        positions = inputs.get("position_ids")
        if positions is None:  # one example per row
            positions = torch.arange(ids.shape[1]).expand_as(ids)
        positions = positions.cpu()
        first = self._is_first_level(ids)
        for row in range(ids.shape[0]):
            starts = torch.nonzero(positions[row] == 0).flatten().tolist()
            ends = [*starts[1:], ids.shape[1]]
            for start, end in zip(starts, ends, strict=True):
                window = ids[row, start] == self.bos_token_id and start + 1 < end
                if window and first[row, start + 1]:
                    items = (start + torch.nonzero(first[row, start:end]).flatten()).tolist()
                    yield row, start, end, items


class ItemCorruption(_WindowItems):
    """Replace a share of the items in sequence windows by random catalog items, in the inputs
    of each training batch (a fresh draw every step, so every epoch sees other contexts).

    A replaced item's SID tokens are not targets (their labels are masked); the items after it
    are still predicted, now from a context the user never had. The model then cannot rely on
    recognizing a memorized sequence verbatim, which is what a test row asks of it: its newest
    item (the valid target) was never in training. Only windows are touched, never the
    alignment pairs.
    """

    def __init__(self, item_tokens: torch.Tensor, share: float, bos_token_id: int):
        super().__init__(item_tokens, bos_token_id)
        self.share = share

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        ids, labels = inputs["input_ids"].clone(), inputs["labels"].clone()
        length = self.item_tokens.shape[1]
        for row, _, end, item_starts in self.windows(inputs):
            chosen = torch.tensor(item_starts)[torch.rand(len(item_starts)) < self.share]
            for s in chosen.tolist():
                if s + length <= end:
                    pick = int(torch.randint(len(self.item_tokens), ()))
                    ids[row, s : s + length] = self.item_tokens[pick]
                    labels[row, s : s + length] = -100
        return {**inputs, "input_ids": ids, "labels": labels}


class ItemDeletion(_WindowItems):
    """Delete a share of the items (SID and terminator) from sequence windows in each training
    batch, a fresh draw every step: the items after a deleted one are predicted across a gap,
    as a test row's newest item follows a step no training window holds. Later columns move up,
    position ids restart per example as before, and the row is padded back to its width.
    Alignment pairs are never touched."""

    def __init__(
        self,
        item_tokens: torch.Tensor,
        share: float,
        bos_token_id: int,
        eos_token_id: int,
        pad_token_id: int,
    ):
        super().__init__(item_tokens, bos_token_id)
        self.share = share
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        ids, labels = inputs["input_ids"], inputs["labels"]
        span = self.item_tokens.shape[1] + 1  # SID tokens and the terminator
        keep = torch.ones_like(ids, dtype=torch.bool)
        for row, _, end, item_starts in self.windows(inputs):
            for s in torch.tensor(item_starts)[torch.rand(len(item_starts)) < self.share].tolist():
                if s + span <= end and ids[row, s + span - 1] == self.eos_token_id:
                    keep[row, s : s + span] = False
        if keep.all():
            return inputs
        positions, mask = inputs.get("position_ids"), inputs.get("attention_mask")
        out = {
            **inputs,
            "input_ids": torch.full_like(ids, self.pad_token_id),
            "labels": torch.full_like(labels, -100),
        }
        if positions is not None:
            out["position_ids"] = torch.zeros_like(ids)
        elif mask is not None:
            out["attention_mask"] = torch.zeros_like(mask)
        for row in range(ids.shape[0]):
            kept = keep[row]
            n = int(kept.sum())
            out["input_ids"][row, :n] = ids[row][kept]
            out["labels"][row, :n] = labels[row][kept]
            if positions is not None:
                out["position_ids"][row, :n] = _restarted_positions(positions[row], kept)
            elif mask is not None:  # unpacked rows: right-padded, so the mask is a prefix
                out["attention_mask"][row, : int((kept & mask[row].bool()).sum())] = 1
        return out


def _moved(inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch with its tensors on ``device``."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _restarted_positions(positions: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Position ids of a packed row's kept columns, restarting at 0 where an example starts
    (where the old position was 0)."""
    example = torch.cumsum(positions == 0, 0)[kept]
    offsets = torch.arange(len(example))
    first = torch.ones(len(example), dtype=torch.bool)
    first[1:] = example[1:] != example[:-1]
    starts = torch.cummax(torch.where(first, offsets, 0), 0).values
    return offsets - starts


class SidSFTTrainer(SFTTrainer):
    """``SFTTrainer`` that keeps packed rows apart (:class:`RowPackedCollator`, when
    ``args.packing``) and whose loss on a CPU is the model's own (``Trainer.compute_loss``).
    ``shard`` records the rows this process trained on (its shard under ``accelerate launch``)."""

    def __init__(
        self,
        *args: Any,
        augment: list[Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
        teacher: Any = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.augment = augment or []
        """Applied in order to every training batch (:class:`ItemCorruption`, :class:`ItemDeletion`)."""
        self.teacher = teacher
        """A :class:`models.distill.SasrecTeacher` whose soft targets join the training loss."""
        self._pad_token_id: int = self._tokenizer.pad_token_id  # set by SFTTrainer
        if isinstance(self.args, SFTConfig) and self.args.packing:
            # instead of TRL's padding-free flattening (see the module doc)
            self.data_collator = RowPackedCollator(self._pad_token_id)
        self.shard = ShardRecord()

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        rows = inputs["input_ids"]
        if self.shard.first_batch is None:  # only the first batch is fingerprinted
            rows = [row[row != self._pad_token_id].tolist() for row in rows]
        self.shard.add(rows)
        if self.augment:  # rewritten item by item: on the CPU, then back to the batch's device
            device = inputs["input_ids"].device
            inputs = _moved(inputs, torch.device("cpu"))
            for augment in self.augment:
                inputs = augment(inputs)
            inputs = _moved(inputs, device)
        return super().training_step(model, inputs, *args, **kwargs)

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        distill = self.teacher is not None and model.training
        if self.args.device.type != "cpu" and not distill:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs["use_cache"] = False
        if model.training:  # TRL's num_tokens log
            mask = inputs.get("attention_mask")
            if mask is None:  # packed rows
                mask = inputs["input_ids"] != self._pad_token_id
            self._total_train_tokens += int(mask.sum())
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        head = None if return_outputs else self._plain_head(model)
        if head is None and not distill:
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
        batch = dict(inputs)  # the trainer may pop the labels, which the teacher reads
        outputs: Any = None
        states: list[torch.Tensor] = []
        if head is not None:  # the loss through the output layer in one step (models/head_loss)
            loss, hidden = self._head_loss(model, head, inputs, num_items_in_batch)
            states.append(hidden)
        else:
            # a plain output layer: its input states are kept, so the teacher's loss needs only
            # the SID rows of its weight (peft's wrapped layer under LoRA: the logits instead)
            head = self.accelerator.unwrap_model(model).get_output_embeddings()
            hook = None
            if isinstance(head, torch.nn.Linear) and head.bias is None:
                hook = head.register_forward_hook(lambda _m, args, _out: states.append(args[0]))
            try:
                loss, outputs = Trainer.compute_loss(self, model, inputs, True, num_items_in_batch)
            finally:
                if hook is not None:
                    hook.remove()
        targets = self.teacher.targets(batch) if distill else []
        if targets:
            soft = self.teacher.loss(
                targets,
                None if states else outputs.logits,
                states=states[0] if states else None,
                head=head.weight if states else None,
            )
            self._metrics["train"].setdefault("distill_loss", []).append(float(soft.detach()))
            loss = loss + self.teacher.weight * soft
        return (loss, outputs) if return_outputs else loss

    def _plain_head(self, model: Any) -> torch.nn.Linear | None:
        """The output layer when :func:`models.head_loss.head_cross_entropy` can stand in for
        the model's loss: training on a CPU in one process (the model not wrapped for DDP), a
        model whose logits are its output layer's (no scaling or capping), a layer without bias
        (not peft's wrapper), no label smoothing or custom loss."""
        # a wrapped model (DDP, even of one process under `accelerate launch`) must run its own
        # forward, which synchronizes the gradients; it has no config or output layer of its own
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        plain = (
            model.training
            and self.args.device.type == "cpu"
            and self.accelerator.num_processes == 1
            and self.accelerator.unwrap_model(model) is model
            and self.label_smoother is None
            and getattr(self, "compute_loss_func", None) is None
            and getattr(getattr(model, "config", None), "model_type", None) in PLAIN_HEAD_MODELS
            and isinstance(head, torch.nn.Linear)
            and head.bias is None
        )
        return head if plain else None

    def _head_loss(
        self, model: Any, head: torch.nn.Linear, inputs: dict[str, Any], num_items_in_batch: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The causal LM loss as the model computes it (summed over the labelled tokens, divided
        by ``num_items_in_batch`` or their count), and the output layer's input states."""
        labels = inputs["labels"]
        kwargs = {k: v for k, v in inputs.items() if k not in ("labels", "num_items_in_batch")}
        states = model.base_model(**kwargs).last_hidden_state
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]  # position i predicts token i + 1
        total = head_cross_entropy(states, head.weight, shifted)
        if num_items_in_batch is not None and getattr(self, "model_accepts_loss_kwargs", False):
            return total / num_items_in_batch, states
        return total / (shifted != -100).sum().clamp(min=1), states
