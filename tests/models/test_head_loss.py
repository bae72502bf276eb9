"""head_cross_entropy: the cross-entropy of an output layer's logits, computed block by block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.head_loss import head_cross_entropy


def _inputs(rows: int = 37, hidden: int = 8, vocab: int = 11, ignored: float = 0.3):
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(2, rows, hidden, generator=generator)
    weight = torch.randn(vocab, hidden, generator=generator)
    labels = torch.randint(0, vocab, (2, rows), generator=generator)
    labels[torch.rand(2, rows, generator=generator) < ignored] = -100
    return states, weight, labels


@pytest.mark.parametrize("block", [1, 5, 256])
def test_loss_and_gradients_are_the_summed_cross_entropy_of_the_logits(block):
    states, weight, labels = _inputs()
    ours = [states.clone().requires_grad_(), weight.clone().requires_grad_()]
    theirs = [states.clone().requires_grad_(), weight.clone().requires_grad_()]
    loss = head_cross_entropy(*ours, labels, block=block)
    logits = theirs[0] @ theirs[1].T
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    (3 * loss).backward()  # an upstream gradient other than 1 reaches both gradients
    (3 * expected).backward()
    torch.testing.assert_close(loss, expected)
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine.grad, reference.grad)
    # the ignored positions get no gradient
    assert torch.all(ours[0].grad[labels == -100] == 0)


def test_a_batch_without_labels_has_zero_loss_and_zero_gradients():
    states, weight, labels = _inputs()
    states.requires_grad_()
    loss = head_cross_entropy(states, weight, torch.full_like(labels, -100))
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(states.grad == 0)


def test_it_is_float32_under_bf16_autocast():
    states, weight, labels = _inputs()
    expected = head_cross_entropy(states, weight, labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = head_cross_entropy(states, weight, labels)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected)


def test_bad_shapes_and_labels_are_refused():
    states, weight, labels = _inputs()
    with pytest.raises(ValueError, match="do not match labels"):
        head_cross_entropy(states, weight, labels[:, 1:])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 11\)"):
        head_cross_entropy(states, weight, labels.clamp(min=0) + 11)
    with pytest.raises(ValueError, match="block must be >= 1"):
        head_cross_entropy(states, weight, labels, block=0)
