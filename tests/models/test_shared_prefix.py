"""completion_logits: each distinct prompt encoded once gives the plain forward's logits and
gradients, for prompts repeated in any order, left-padded to different lengths."""

from __future__ import annotations

import pytest
import torch

from models.lm import load_model_dir
from models.shared_prefix import completion_logits


@pytest.fixture(scope="module")
def model_and_batch(tiny_model, tmp_path_factory):
    """The shared tiny model (one layer, grouped-query attention) and 12 rows: 3 prompts of
    different lengths, left-padded, each with 4 completions, in a shuffled order."""
    model, tokenizer = load_model_dir(tiny_model(tmp_path_factory.mktemp("tiny")))
    model.train()
    gen = torch.Generator().manual_seed(0)
    pad, vocab = tokenizer.pad_token_id, len(tokenizer)
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 9, 7)]
    width, g, k = 9, 4, 3
    rows, order = [], torch.randperm(len(prompts) * g, generator=gen)  # TRL shuffles the batch
    for r in order.tolist():
        p = prompts[r // g]
        completion = torch.randint(3, vocab, (k,), generator=gen).tolist()
        rows.append([pad] * (width - len(p)) + p + completion)
    ids = torch.tensor(rows)
    mask = (ids != pad).long()
    return model, ids, mask, k


def _plain(model, ids, mask, k):
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -k - 1 : -1]


@pytest.mark.parametrize("keep", [1, 3])
def test_shared_prompts_give_the_plain_logits_and_gradients(model_and_batch, keep):
    model, ids, mask, k = model_and_batch
    ids, mask = ids[:, : ids.shape[1] - k + keep], mask[:, : ids.shape[1] - k + keep]
    weights = torch.randn(ids.shape[0], keep, 1, generator=torch.Generator().manual_seed(1))
    results = []
    for method in (completion_logits, _plain):
        model.zero_grad()
        logits = method(model, ids, mask, keep)
        (logits.log_softmax(-1) * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logits.detach(), grads))
    (ours, our_grads), (plain, plain_grads) = results
    assert ours.shape == plain.shape == (ids.shape[0], keep, model.config.vocab_size)
    assert torch.allclose(ours, plain, atol=1e-5)
    assert our_grads.keys() == plain_grads.keys() and len(our_grads) > 4
    for name, grad in our_grads.items():
        assert torch.allclose(grad, plain_grads[name], atol=1e-5, rtol=1e-4), name


def test_distinct_prompts_run_once(model_and_batch):
    """The decoder sees 3 prompt rows, not 12: the prompts of one group are encoded once."""
    model, ids, mask, k = model_and_batch
    seen = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["input_ids"].shape), with_kwargs=True
    )
    try:
        completion_logits(model, ids, mask, k)
    finally:
        hook.remove()
    assert seen == [torch.Size([3, ids.shape[1] - k]), torch.Size([12, k - 1])]


def test_a_completion_as_long_as_the_rows_is_refused(model_and_batch):
    model, ids, mask, _ = model_and_batch
    with pytest.raises(ValueError, match="logits_to_keep"):
        completion_logits(model, ids, mask, ids.shape[1])


def test_checkpointed_training_scores_the_rows_as_they_come(model_and_batch):
    """A checkpointed layer drops the cache while training: the same logits, no cache used."""
    model, ids, mask, k = model_and_batch
    plain = _plain(model, ids, mask, k).detach()
    model.gradient_checkpointing_enable()
    try:
        ours = completion_logits(model, ids, mask, k).detach()
    finally:
        model.gradient_checkpointing_disable()
    assert torch.allclose(ours, plain, atol=1e-5)
