"""The language-model loss through the output layer in one step, for SFT on a CPU.

The model's own loss projects every position of the batch onto the whole vocabulary, takes a
log-softmax of that (positions x vocabulary) tensor, keeps one entry per position, and on the
way back writes three more tensors of the same size (a zeroed gradient, the log-softmax's
gradient, the gradient of the logits). With the tiny model and a vocabulary of text and SID
tokens those passes over memory are a large share of a CPU step, more than the decoder layers.

:func:`head_cross_entropy` scores only the positions that have a label, in blocks of rows
small enough to stay in the CPU's cache, and keeps no logits: the backward pass recomputes a
block's logits, turns them into ``softmax - one_hot`` in place and multiplies out both
gradients from there. The loss and gradients are the cross-entropy's (the same sums, in a
different order: they agree to float rounding); ``python -m bench.head_loss`` times it
against the model's own loss.
"""

from __future__ import annotations

from typing import Any

import torch

BLOCK_ROWS = 256
"""Positions per block: 256 x a few thousand logits in float32 is a few MB (fastest of 128-1024
here)."""


class _HeadCrossEntropy(torch.autograd.Function):
    """Sum over rows of ``-log softmax(states @ weight.T)[target]``."""

    @staticmethod
    def forward(
        ctx: Any, states: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, block: int
    ) -> torch.Tensor:
        total = states.new_zeros(())
        lse = states.new_empty(len(states))
        with torch.autocast(states.device.type, enabled=False):  # float32, as the inputs are
            for start in range(0, len(states), block):
                rows = slice(start, start + block)
                logits = states[rows] @ weight.T
                lse[rows] = torch.logsumexp(logits, -1)
                total += (lse[rows] - logits.gather(1, target[rows, None]).squeeze(1)).sum()
        ctx.save_for_backward(states, weight, target, lse)
        ctx.block = block
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        states, weight, target, lse = ctx.saved_tensors
        grad_states = torch.empty_like(states)
        grad_weight = torch.zeros_like(weight)
        with torch.autocast(states.device.type, enabled=False):
            for start in range(0, len(states), ctx.block):
                rows = slice(start, start + ctx.block)
                # d loss / d logits = softmax - one_hot, built in the logits' own buffer
                logits = states[rows] @ weight.T
                logits.sub_(lse[rows, None]).exp_()
                logits[torch.arange(len(logits)), target[rows]] -= 1
                logits.mul_(grad)
                torch.mm(logits, weight, out=grad_states[rows])
                grad_weight.addmm_(logits.T, states[rows])
        return grad_states, grad_weight, None, None


def head_cross_entropy(
    states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    block: int = BLOCK_ROWS,
) -> torch.Tensor:
    """Summed cross-entropy of the logits ``states @ weight.T`` against ``labels``, over the
    positions whose label is not ``ignore_index``.

    ``states``: (..., hidden) the output layer's inputs; ``weight``: (vocabulary, hidden) its
    weight (a layer without bias); ``labels``: (...) token ids aligned with ``states`` (already
    shifted: position i's label is the token after it). Computed in float32."""
    if states.shape[:-1] != labels.shape:
        raise ValueError(f"states {tuple(states.shape)} do not match labels {tuple(labels.shape)}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    keep = labels != ignore_index
    picked = states[keep].float()
    target = labels[keep]
    if len(target) and (target.min() < 0 or target.max() >= len(weight)):
        raise ValueError(f"labels must lie in [0, {len(weight)}) or be {ignore_index}")
    return _HeadCrossEntropy.apply(picked, weight.float(), target, block)
