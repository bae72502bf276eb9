"""The SFT anchor of GRPO (``grpo.sft_anchor``): batches of SFT examples whose prompt and
padding carry no loss, drawn reproducibly, and a loss that trains the model on them."""

from __future__ import annotations

import pytest
import torch

from models.lm import add_sid_tokens, build_tiny, train_tokenizer
from models.prompts import Example, seq_rec_prompt
from models.sft_anchor import SftAnchor

LEVELS, K = 2, 4


@pytest.fixture(scope="module")
def tokenizer():
    tok = train_tokenizer([seq_rec_prompt([]), "The user interacted with"] * 5, 300)
    add_sid_tokens(tok, LEVELS, K)
    return tok


def _windows(tokenizer, n):
    """``n`` sequence examples (BOS prompt, then 1 + i items' SIDs and EOS), of growing length."""
    bos, eos = tokenizer.bos_token or tokenizer.eos_token, tokenizer.eos_token
    sid = lambda i: f"<a_{i % K}><b_{(i + 1) % K}>"  # noqa: E731
    return [Example(bos, "".join(sid(j) + eos for j in range(i + 1))) for i in range(n)]


def _tiny_model(tokenizer):
    return build_tiny(
        tokenizer, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64,
        max_length=64, seed=0,
    )  # fmt: skip


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_batch_holds_whole_examples_with_loss_on_their_completions_only(tokenizer):
    examples = _windows(tokenizer, 5)
    anchor = SftAnchor(examples, tokenizer, weight=1.0, per_step=3, seed=0)
    batch = anchor.batch()
    encoded = {tuple(_ids(tokenizer, e.prompt + e.completion)): e for e in examples}
    assert batch["input_ids"].shape[0] == 3
    seen = set()
    rows = zip(batch["input_ids"], batch["attention_mask"], batch["labels"], strict=True)
    for ids, mask, labels in rows:
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # right padding
        row = tuple(ids[:n].tolist())
        assert row in encoded  # a whole example, as the tokenizer encodes it
        prompt = len(_ids(tokenizer, encoded[row].prompt))
        assert (labels[:prompt] == -100).all() and (labels[n:] == -100).all()
        assert labels[prompt:n].tolist() == list(row[prompt:])  # every completion token
        assert (ids[n:] == tokenizer.pad_token_id).all()
        seen.add(row)
    assert len(seen) == 3  # drawn without replacement


def test_draws_are_seeded_and_change_from_step_to_step(tokenizer):
    examples = _windows(tokenizer, 8)
    a, b = (SftAnchor(examples, tokenizer, weight=1.0, per_step=2, seed=3) for _ in range(2))
    first, again = a.batch()["input_ids"], b.batch()["input_ids"]
    assert torch.equal(first, again)
    steps = [a.batch()["input_ids"].tolist() for _ in range(5)]
    assert any(s != first.tolist() for s in steps)


def test_more_windows_per_step_than_examples_repeat_examples(tokenizer):
    anchor = SftAnchor(_windows(tokenizer, 2), tokenizer, weight=1.0, per_step=5, seed=0)
    assert anchor.batch()["input_ids"].shape[0] == 5


def test_the_anchor_loss_is_the_models_cross_entropy_on_completion_tokens(tokenizer):
    model = _tiny_model(tokenizer)
    (example,) = _windows(tokenizer, 1)
    anchor = SftAnchor([example], tokenizer, weight=1.0, per_step=1, seed=0)
    prompt, completion = _ids(tokenizer, example.prompt), _ids(tokenizer, example.completion)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = model(input_ids=ids).logits.log_softmax(-1)[0]
        expected = -torch.stack(
            [logp[len(prompt) + j - 1, t] for j, t in enumerate(completion)]
        ).mean()
        assert float(anchor.loss(model, "cpu")) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize(("weight", "per_step"), [(0.0, 1), (1.0, 0)])
def test_an_anchor_without_weight_or_windows_is_refused(tokenizer, weight, per_step):
    with pytest.raises(ValueError, match="weight must be > 0 and per_step >= 1"):
        SftAnchor(_windows(tokenizer, 2), tokenizer, weight=weight, per_step=per_step, seed=0)
    with pytest.raises(ValueError, match="at least one example"):
        SftAnchor([], tokenizer, weight=1.0, per_step=1, seed=0)


def test_a_teacher_adds_its_weighted_term_to_the_cross_entropy(tokenizer):
    model = _tiny_model(tokenizer)
    (example,) = _windows(tokenizer, 1)
    seen: list[dict] = []

    class Teacher:
        weight = 0.5

        def __init__(self, targets: list):
            self._targets = targets

        def targets(self, batch: dict) -> list:
            seen.append(batch)
            return self._targets

        def loss(self, targets: list, logits: torch.Tensor) -> torch.Tensor:
            assert targets == ["places"] and logits.shape[0] == 1
            return logits.new_tensor(3.0)

    plain = SftAnchor([example], tokenizer, weight=1.0, per_step=1, seed=0)
    taught = SftAnchor(
        [example], tokenizer, weight=1.0, per_step=1, seed=0, teacher=Teacher(["places"])
    )
    none = SftAnchor([example], tokenizer, weight=1.0, per_step=1, seed=0, teacher=Teacher([]))
    with torch.no_grad():
        ce = float(plain.loss(model, "cpu"))
        assert float(taught.loss(model, "cpu")) == pytest.approx(ce + 0.5 * 3.0, rel=1e-5)
        assert float(none.loss(model, "cpu")) == pytest.approx(ce, rel=1e-5)  # no window items
    assert torch.equal(seen[0]["labels"], plain.batch()["labels"])  # the scored batch itself
