"""Language-model helpers: training-time residual dropout."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from models.lm import add_residual_dropout


@pytest.fixture
def decoder() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return Qwen2ForCausalLM(config)


TOKENS = torch.tensor([[1, 2, 3, 4, 5]])


def test_residual_dropout_hooks_embeddings_and_every_block_output(decoder):
    # the embeddings, then each layer's attention output projection and MLP down projection
    assert add_residual_dropout(decoder, 0.3) == 1 + 2 * 3


def test_residual_dropout_changes_training_passes_only(decoder):
    decoder.eval()
    before = decoder(TOKENS).logits
    add_residual_dropout(decoder, 0.5)
    assert torch.equal(decoder(TOKENS).logits, before)  # inference never drops
    decoder.train()
    first, second = decoder(TOKENS).logits, decoder(TOKENS).logits
    assert not torch.allclose(first, before)
    assert not torch.allclose(first, second)  # a fresh mask per pass


def test_zero_residual_dropout_adds_no_hooks(decoder):
    decoder.train()
    torch.manual_seed(1)
    before = decoder(TOKENS).logits
    assert add_residual_dropout(decoder, 0.0) == 0
    assert all(not m._forward_hooks for m in decoder.modules())
    torch.manual_seed(1)
    assert torch.equal(decoder(TOKENS).logits, before)


def test_under_lora_the_whole_branch_output_is_dropped_delta_included(decoder):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=4,
        target_modules="all-linear",
        modules_to_save=["embed_tokens", "lm_head"],
        init_lora_weights=False,  # a non-zero delta from the start
    )
    wrapped = get_peft_model(decoder, lora)
    # the wrappers are hooked (o_proj returns base + delta), never a layer inside one again
    assert add_residual_dropout(wrapped, 1.0) == 1 + 2 * 3
    o_proj = wrapped.base_model.model.model.layers[0].self_attn.o_proj
    assert o_proj._forward_hooks and not o_proj.base_layer._forward_hooks
    seen = []
    o_proj.register_forward_hook(lambda _m, _i, out: seen.append(out))  # runs after the drop
    wrapped.train()
    wrapped(TOKENS)
    assert torch.count_nonzero(seen[-1]) == 0  # p = 1: nothing of base or delta survives
    wrapped.eval()
    wrapped(TOKENS)
    assert torch.count_nonzero(seen[-1]) > 0


@pytest.mark.parametrize("tied", [True, False])
def test_the_tiny_decoder_ties_its_output_layer_only_when_asked(tied, tmp_path):
    from models.lm import add_sid_tokens, build_tiny, load_model_dir, train_tokenizer

    tokenizer = train_tokenizer(["The user interacted with"] * 5, 300)
    add_sid_tokens(tokenizer, 2, 4)
    model = build_tiny(
        tokenizer, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64,
        max_length=64, seed=0, tie_embeddings=tied,
    )  # fmt: skip
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert (inputs.data_ptr() == outputs.data_ptr()) is tied
    body = model.num_parameters() - len(tokenizer) * 32 * (1 if tied else 2)
    assert body == sum(p.numel() for p in model.model.layers.parameters()) + 32  # + final norm
    # saved and loaded, the model keeps its own head (or its tie)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_model_dir(tmp_path)
    head = loaded.get_output_embeddings().weight
    assert (loaded.get_input_embeddings().weight.data_ptr() == head.data_ptr()) is tied
    assert torch.equal(head, outputs)
