"""Prompt formats: what a history looks like to a model trained with each SFT objective."""

from __future__ import annotations

import pytest
import torch

from models.lm import add_sid_tokens, train_tokenizer
from models.prompts import (
    FORMAT_KEY,
    PromptBuilder,
    prompt_format,
    seq_rec_prompt,
    set_prompt_format,
)
from models.sid_trie import SidTrie

SID_MAP = {"x": [0, 1], "y": [1, 0], "z": [1, 1]}


@pytest.fixture(scope="module")
def tokenizer():
    tok = train_tokenizer(["Film number one", seq_rec_prompt([])] * 5, 300)
    add_sid_tokens(tok, 2, 2)
    return tok


def _builder(tokenizer, fmt, max_length=64):
    return PromptBuilder(
        tokenizer=tokenizer,
        sid_map=SID_MAP,
        titles=dict.fromkeys(SID_MAP, "t"),
        max_length=max_length,
        fmt=fmt,
    )


def test_sequence_prompts_are_sids_each_closed_by_eos(tokenizer):
    builder = _builder(tokenizer, "sequence")
    prompt = builder.history_prompt(["x", "z"])
    assert prompt == "<|bos|><a_0><b_1><|eos|><a_1><b_1><|eos|>"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert len(ids) == 1 + 2 * 3  # one token per code, EOS as a single token
    # the constrained decoder reads the step from trailing SID tokens: the prompt ends outside
    trie = SidTrie.from_sid_map(SID_MAP, tokenizer)
    assert not bool(trie.is_sid_token(torch.tensor(ids[-1:])).any())
    assert builder.history_prompt([]) == "<|bos|>"


def test_a_sequence_example_makes_every_item_a_target(tokenizer):
    example = _builder(tokenizer, "sequence").sequence_example(["y", "x", "y"])
    assert example.prompt == "<|bos|>"
    assert example.completion == "<a_1><b_0><|eos|><a_0><b_1><|eos|><a_1><b_0><|eos|>"


def test_text_prompts_are_unchanged(tokenizer):
    builder = _builder(tokenizer, "text")
    assert builder.history_prompt(["x"]) == "The user interacted with <a_0><b_1>. Next item:"


def test_sequence_prompts_lose_their_oldest_items_to_fit(tokenizer):
    builder = _builder(tokenizer, "sequence", max_length=2 + 2 + 1 + 3 * 2)  # room for 2 items
    assert builder.history_prompt(["x", "y", "z"]) == "<|bos|><a_1><b_0><|eos|><a_1><b_1><|eos|>"
    assert builder.truncated == 1


def test_the_format_is_saved_with_the_model(tokenizer, tmp_path, tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model(tmp_path / "tiny"))
    assert prompt_format(model) == "text"  # models saved before formats existed
    set_prompt_format(model, "sequence")
    model.save_pretrained(tmp_path / "saved")
    assert prompt_format(AutoModelForCausalLM.from_pretrained(tmp_path / "saved")) == "sequence"
    setattr(model.config, FORMAT_KEY, "bogus")
    with pytest.raises(ValueError, match="unknown prompt format 'bogus'"):
        prompt_format(model)
    with pytest.raises(ValueError, match="unknown prompt format"):
        _builder(tokenizer, "bogus")


def test_alignment_texts_are_cut_to_fit_the_context_and_counted(tokenizer):
    long_text = " ".join(["Film number one"] * 40)
    builder = PromptBuilder(
        tokenizer=tokenizer, sid_map=SID_MAP, titles={"x": long_text, "y": "t"}, max_length=32
    )
    for task in ("sid2title", "title2sid"):
        examples = builder.alignment_examples(task)
        for example in examples:  # BOS + pair + EOS within the context, the SID whole
            pair = builder.count(example.prompt) + builder.count(example.completion)
            assert pair + 2 <= 32
        assert examples[1].completion in (" t", "<a_1><b_0>")  # a short text is left alone
    assert builder.texts_cut == 2  # the long text, once per task
    title2sid = builder.alignment_examples("title2sid")[0]
    assert title2sid.completion == "<a_0><b_1>" and "Film number one" in title2sid.prompt
    # GRPO's title prompt for the item is that pair's prompt: its SID completion fits too
    assert builder.title_prompt("x") == title2sid.prompt
    assert builder.title_prompt("y") == builder.alignment_examples("title2sid")[1].prompt
