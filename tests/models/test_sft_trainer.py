"""SidSFTTrainer's packed rows: several examples per row, none attending to another."""

from __future__ import annotations

import math

import pytest
import torch

from models.lm import load_model_dir
from models.sft_trainer import ItemCorruption, ItemDeletion, RowPackedCollator, SidSFTTrainer

PAD = 0


def test_packed_rows_are_padded_per_row_with_positions_restarting_per_example():
    batch = RowPackedCollator(PAD)(
        [
            {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, 6, 7, -100, 9], "seq_lengths": [3, 2]},
            {"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "seq_lengths": [3]},
        ]
    )
    assert "attention_mask" not in batch  # the examples are read from the position ids
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 0]]
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, PAD, PAD]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9], [-100, 2, 3, -100, -100]]


def test_an_example_in_a_packed_row_sees_only_itself(tiny_model, tmp_path):
    model, _ = load_model_dir(tiny_model(tmp_path / "m"))
    model.eval()
    first, second = [7, 8, 9, 10], [11, 12, 13]
    batch = RowPackedCollator(PAD)(
        [
            {"input_ids": first + second, "labels": first + second, "seq_lengths": [4, 3]},
            {"input_ids": second, "labels": second, "seq_lengths": [3]},
        ]
    )
    batch.pop("labels")
    with torch.no_grad():  # training runs without a cache (with one, no packing is detected)
        packed = model(**batch, use_cache=False).logits
        alone = model(input_ids=torch.tensor([second])).logits
        unpacked = model(input_ids=torch.tensor([first + second])).logits
    # the second example packed after the first gives exactly what it gives alone ...
    torch.testing.assert_close(packed[0, 4:], alone[0], rtol=1e-5, atol=1e-5)
    # ... and in a row padded after it; without the packing it would read the first example
    torch.testing.assert_close(packed[1, :3], alone[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unpacked[0, 4:], alone[0], atol=1e-3)


def _tiny_sft_args(tmp_path, *, packing: bool, batch_size: int, steps: int, **extra):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_length=32,
        packing=packing,
        packing_strategy="bfd",
        completion_only_loss=True,
        per_device_train_batch_size=batch_size,
        max_steps=steps,
        use_cpu=True,
        report_to=[],
        **extra,
    )


@pytest.mark.parametrize("packing", [True, False])
def test_the_trainer_packs_whole_examples_into_rows_only_when_asked(tiny_model, tmp_path, packing):
    from datasets import Dataset

    model, tokenizer = load_model_dir(tiny_model(tmp_path / "m"))
    examples = [{"prompt": "<|bos|>", "completion": "<a_1><b_2><|eos|>" * n} for n in (1, 2, 3, 10)]
    args = _tiny_sft_args(tmp_path, packing=packing, batch_size=2, steps=1)
    trainer = SidSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
    )
    rows = trainer.train_dataset
    if packing:
        assert isinstance(trainer.data_collator, RowPackedCollator)
        # <bos> + 10 SIDs (3 tokens each) = 31 tokens fill a row alone; the three short ones share one
        assert sorted(len(r["seq_lengths"]) for r in rows) == [1, 3]
        assert all(len(r["input_ids"]) <= 32 for r in rows)
    else:
        assert not isinstance(trainer.data_collator, RowPackedCollator)
        assert len(rows) == len(examples)
    before = model.model.embed_tokens.weight.detach().clone()
    trainer.train()
    assert not torch.equal(before, model.model.embed_tokens.weight)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_the_loss_on_packed_rows_is_the_label_smoothed_cross_entropy_of_the_completions(
    tiny_model, tmp_path, smoothing
):
    from datasets import Dataset

    model, tokenizer = load_model_dir(tiny_model(tmp_path / "m"))
    examples = [{"prompt": "<|bos|>", "completion": "<a_1><b_2><|eos|>" * n} for n in (1, 2)]
    args = _tiny_sft_args(
        tmp_path, packing=True, batch_size=1, steps=1, label_smoothing_factor=smoothing
    )
    trainer = SidSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
    )
    batch = trainer.data_collator([trainer.train_dataset[0]])
    labels = batch["labels"][0, 1:]
    with torch.no_grad():
        loss = trainer.compute_loss(model, dict(batch))
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    log_probs = logits[0, :-1].log_softmax(-1)[labels != -100]
    nll = -log_probs.gather(1, labels[labels != -100, None]).mean()
    uniform = -log_probs.mean()  # the cross-entropy against an even spread over the vocabulary
    assert labels[labels != -100].numel() >= 3  # the completion tokens are the targets
    torch.testing.assert_close(loss, (1 - smoothing) * nll + smoothing * uniform)


def test_training_on_a_cpu_computes_the_models_loss_through_the_output_layer_in_one_step(
    tiny_model, tmp_path, monkeypatch
):
    """models/head_loss stands in for the model's own loss while training: the same value and
    the same gradients; evaluation, label smoothing and outputs keep the model's path."""
    from datasets import Dataset
    from transformers import Trainer

    from models import sft_trainer

    model, tokenizer = load_model_dir(tiny_model(tmp_path / "m"))
    examples = [{"prompt": "<|bos|>", "completion": "<a_1><b_2><|eos|>" * n} for n in (2, 8, 9)]
    args = _tiny_sft_args(tmp_path, packing=True, batch_size=2, steps=1)
    trainer = SidSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
    )
    rows = trainer.train_dataset
    assert len(rows) == 2  # a row of 28 tokens; one of 25 + 7, padded to 28
    batch = trainer.data_collator([rows[0], rows[1]])
    calls = []
    fused = sft_trainer.head_cross_entropy
    monkeypatch.setattr(
        sft_trainer, "head_cross_entropy", lambda *a, **k: calls.append(1) or fused(*a, **k)
    )

    def loss_and_grads(compute):
        model.zero_grad()
        loss = compute(model, dict(batch), num_items_in_batch=torch.tensor(7))
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    model.train()
    assert trainer._plain_head(model) is model.lm_head
    loss, grads = loss_and_grads(trainer.compute_loss)
    assert calls == [1]
    expected, expected_grads = loss_and_grads(
        lambda *a, **k: Trainer.compute_loss(trainer, *a, **k)
    )
    assert calls == [1]  # the model's own loss does not use it
    torch.testing.assert_close(loss, expected)  # summed over the labels, divided by the 7 given
    for mine, reference in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(mine, reference)
    assert trainer._plain_head(model) is not None
    # a model wrapped for DDP (even one process under `accelerate launch`) runs its own forward
    wrapped = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel
    )
    torch.nn.Module.__init__(wrapped)
    wrapped.module = model
    assert wrapped.training and trainer._plain_head(wrapped) is None
    model.eval()
    assert trainer._plain_head(model) is None  # evaluation: the model's own loss
    smoothed = SidSFTTrainer(
        model=model,
        args=_tiny_sft_args(
            tmp_path, packing=True, batch_size=2, steps=1, label_smoothing_factor=0.1
        ),
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
    )
    model.train()
    assert smoothed._plain_head(model) is None


BOS, EOS = 1, 2
CATALOG = torch.tensor([[10, 20, 30], [11, 21, 31], [12, 22, 32], [13, 23, 33]])
"""Four items' SID token ids: first level 10-13, then 20-23, then 30-33."""


def _packed_window_then_alignment_pair(items: list[int]) -> dict[str, torch.Tensor]:
    """One packed row: a sequence window of ``items`` (BOS, each SID + EOS, all targets), then a
    title2sid pair (text tokens 5 6, then an item's SID as the completion), then padding."""
    window = [BOS, *(t for i in items for t in [*CATALOG[i].tolist(), EOS])]
    pair = [BOS, 5, 6, *CATALOG[0].tolist()]
    ids = [*window, *pair, PAD, PAD]
    labels = [-100, *window[1:], -100, -100, -100, *CATALOG[0].tolist(), -100, -100]
    positions = [*range(len(window)), *range(len(pair)), 0, 0]
    return {
        "input_ids": torch.tensor([ids]),
        "labels": torch.tensor([labels]),
        "position_ids": torch.tensor([positions]),
    }


def test_corruption_replaces_window_items_only_and_masks_their_targets():
    items = [0, 1, 2, 3, 0, 1, 2, 3]
    batch = _packed_window_then_alignment_pair(items)
    torch.manual_seed(0)
    out = ItemCorruption(CATALOG, share=0.999, bos_token_id=BOS)(batch)
    ids, labels = out["input_ids"][0], out["labels"][0]
    window_end = 1 + 4 * len(items)
    for n in range(len(items)):
        start = 1 + 4 * n
        assert ids[start : start + 3].tolist() in CATALOG.tolist()  # a catalog item's SID
        assert labels[start : start + 3].tolist() == [-100] * 3  # not a target
        assert ids[start + 3] == EOS and labels[start + 3] == EOS  # the terminator stays
    # the alignment pair and the padding are untouched, and the input batch is not modified
    assert torch.equal(ids[window_end:], batch["input_ids"][0][window_end:])
    assert torch.equal(labels[window_end:], batch["labels"][0][window_end:])
    assert not torch.equal(out["input_ids"], batch["input_ids"])
    assert batch["labels"][0][1:4].tolist() == CATALOG[0].tolist()


def test_corruption_replaces_about_its_share_of_items_and_nothing_at_zero():
    items = [i % 4 for i in range(200)]
    batch = _packed_window_then_alignment_pair(items)
    torch.manual_seed(0)
    out = ItemCorruption(CATALOG, share=0.25, bos_token_id=BOS)(batch)
    masked = int(((out["labels"] == -100) & (batch["labels"] != -100)).sum()) // 3
    assert 30 <= masked <= 70  # 50 expected of 200; binomial sd ~6
    unchanged = ItemCorruption(CATALOG, share=0.0, bos_token_id=BOS)(batch)
    assert torch.equal(unchanged["input_ids"], batch["input_ids"])
    assert torch.equal(unchanged["labels"], batch["labels"])


def test_deletion_removes_whole_window_items_and_renumbers_the_example():
    items = [0, 1, 2, 3]
    batch = _packed_window_then_alignment_pair(items)
    torch.manual_seed(0)
    while True:  # a draw that deletes some but not all items
        out = ItemDeletion(
            CATALOG, share=0.5, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD
        )(batch)
        ids = out["input_ids"][0].tolist()
        window = ids[: ids.index(BOS, 1)]  # up to the alignment pair's BOS
        kept = (len(window) - 1) // 4
        if 0 < kept < len(items):
            break
    # the window keeps whole items (SID + EOS) in their order, with nothing else in between
    sids = [window[1 + 4 * n : 1 + 4 * n + 3] for n in range(kept)]
    order = [CATALOG.tolist().index(s) for s in sids]
    assert order == sorted(order) and set(order) < set(items)
    assert all(window[4 + 4 * n] == EOS for n in range(kept))
    # labels and positions follow the tokens; the pair is unchanged and the row keeps its width
    assert out["labels"][0][: len(window)].tolist() == [-100, *window[1:]]
    pair = [BOS, 5, 6, *CATALOG[0].tolist()]
    assert ids[len(window) : len(window) + len(pair)] == pair
    assert out["position_ids"][0].tolist()[: len(window) + len(pair)] == [
        *range(len(window)),
        *range(len(pair)),
    ]
    assert len(ids) == batch["input_ids"].shape[1]
    tail = len(window) + len(pair)
    assert set(ids[tail:]) == {PAD} and set(out["labels"][0][tail:].tolist()) == {-100}
    assert set(out["position_ids"][0][tail:].tolist()) == {0}


def test_deletion_removes_about_its_share_and_nothing_at_zero():
    items = [i % 4 for i in range(200)]
    batch = _packed_window_then_alignment_pair(items)
    torch.manual_seed(0)
    deletion = ItemDeletion(
        CATALOG, share=0.25, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD
    )
    out = deletion(batch)
    deleted = int((batch["labels"] == EOS).sum() - (out["labels"] == EOS).sum())
    assert 30 <= deleted <= 70  # 50 expected of 200; binomial sd ~6
    none = ItemDeletion(CATALOG, share=0.0, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    assert none(batch) is batch


def test_deletion_in_unpacked_rows_shortens_the_attention_mask():
    window = [BOS, *(t for i in [0, 1, 2, 3] for t in [*CATALOG[i].tolist(), EOS])]
    batch = {
        "input_ids": torch.tensor([window + [PAD] * 3]),
        "labels": torch.tensor([[-100, *window[1:]] + [-100] * 3]),
        "attention_mask": torch.tensor([[1] * len(window) + [0] * 3]),
    }
    torch.manual_seed(0)
    out = ItemDeletion(CATALOG, share=0.5, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)(
        batch
    )
    ids = out["input_ids"][0]
    real = int(out["attention_mask"][0].sum())
    assert out["attention_mask"][0].tolist() == [1] * real + [0] * (ids.shape[0] - real)
    assert (real - 1) % 4 == 0 and real < len(window)  # whole items were deleted (seeded draw)
    assert set(ids[real:].tolist()) == {PAD} and "position_ids" not in out


def test_the_trainer_applies_its_augmentations_to_every_training_batch_in_order(
    tiny_model, tmp_path
):
    from datasets import Dataset

    model, tokenizer = load_model_dir(tiny_model(tmp_path / "m"))
    examples = [{"prompt": "<|bos|>", "completion": "<a_1><b_2><|eos|>" * n} for n in (1, 2, 3, 4)]
    calls: list[str] = []

    def recorded(name):
        def augment(inputs):
            calls.append(name)
            return inputs

        return augment

    args = _tiny_sft_args(tmp_path, packing=True, batch_size=1, steps=2)
    SidSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
        augment=[recorded("corrupt"), recorded("drop")],
    ).train()
    assert calls == ["corrupt", "drop", "corrupt", "drop"]


def _tiny_teacher(tokenizer, weight: float):
    """A SASRec teacher over every SID of the tiny vocabulary (16 items, 2 levels), and a
    one-example dataset: one window of 3 items, 2 of them with history."""
    from datasets import Dataset

    from models.baselines.sasrec import SASRec, SASRecConfig
    from models.distill import SasrecTeacher
    from models.sid import sid_tokens

    codes = [[a, b] for a in range(4) for b in range(4)]  # every SID of the tiny vocabulary
    torch.manual_seed(0)
    sasrec = SASRec(item_ids=[str(n) for n in range(16)], config=SASRecConfig(max_len=4))
    item_tokens = torch.tensor([tokenizer.convert_tokens_to_ids(sid_tokens(c)) for c in codes])
    teacher = SasrecTeacher(
        sasrec.eval(), item_tokens, bos_token_id=tokenizer.bos_token_id, weight=weight
    )
    window = "".join(f"<a_{a}><b_{b}><|eos|>" for a, b in ([1, 2], [0, 3], [3, 1]))
    return teacher, Dataset.from_list([{"prompt": "<|bos|>", "completion": window}])


def test_the_teacher_adds_its_weighted_soft_target_loss_while_training(tiny_model, tmp_path):
    model, tokenizer = load_model_dir(tiny_model(tmp_path / "m"))
    teacher, dataset = _tiny_teacher(tokenizer, weight=0.7)
    args = _tiny_sft_args(tmp_path, packing=True, batch_size=1, steps=1)
    plain = SidSFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    taught = SidSFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, teacher=teacher
    )
    batch = plain.data_collator([plain.train_dataset[0]])
    targets = teacher.targets(batch)
    assert [len(t.rows) for t in targets] == [2, 2]  # 2 items with history, 2 levels
    model.train()
    with torch.no_grad():
        base = plain.compute_loss(model, dict(batch))
        loss = taught.compute_loss(model, dict(batch))
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        model.eval()  # validation and evaluation: the plain loss (the model's own, the same value)
        torch.testing.assert_close(taught.compute_loss(model, dict(batch)), base)
    # the trainer computes it from the output layer's input states: the same value
    torch.testing.assert_close(loss, base + 0.7 * teacher.loss(targets, logits))
    assert taught._metrics["train"]["distill_loss"]  # logged with the other train metrics


def test_the_teacher_trains_under_bf16_autocast(tiny_model, tmp_path):
    """The GPU workers' mixed precision (bf16 autocast), here on the CPU: the teacher's loss
    from the output layer's input states is finite and a step trains."""
    model, tokenizer = load_model_dir(tiny_model(tmp_path / "m"))
    teacher, dataset = _tiny_teacher(tokenizer, weight=1.0)
    args = _tiny_sft_args(tmp_path, packing=True, batch_size=1, steps=1, bf16=True)
    trainer = SidSFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, teacher=teacher
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    distill = trainer.state.log_history[0]["distill_loss"]
    assert distill > 0 and math.isfinite(distill)
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
