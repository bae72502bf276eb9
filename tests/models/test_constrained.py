"""Constrained SID decoding on a tiny random Qwen2 and a word-level tokenizer (fast)."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LogitsProcessorList, PreTrainedTokenizerFast

from models.constrained import SidConstrainedLogitsProcessor, generate_sids, rank_items
from models.sid import level_token, sid_string, sid_tokens
from models.sid_trie import SidTrie

L_MAX, K_MAX = 4, 16
WORDS = ["<pad>", "<eos>", "<unk>", "user", "watched", "then", "liked", "Answer:"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """Whitespace word-level tokenizer with every SID token ``<a_0>`` … ``<d_15>`` added."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.add_tokens([level_token(lv, c) for lv in range(L_MAX) for c in range(K_MAX)])
    return fast


@pytest.fixture(scope="module")
def model(tokenizer: PreTrainedTokenizerFast) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


SMALL_MAP = {"x": [1, 2], "y": [0, 2], "z": [1, 0], "w": [1, 3]}


def ids_of(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


def sid_ids(tokenizer: PreTrainedTokenizerFast, codes: list[int]) -> list[int]:
    return tokenizer.convert_tokens_to_ids(sid_tokens(codes))


# --- the trie ----------------------------------------------------------------------------


def test_from_sid_map_keeps_item_order_and_finds_items(tokenizer):
    trie = SidTrie.from_sid_map(SMALL_MAP, tokenizer)
    assert trie.item_ids == ("x", "y", "z", "w")
    assert (trie.n_items, trie.levels) == (4, 2)
    expected = [sid_ids(tokenizer, codes) for codes in SMALL_MAP.values()]
    assert trie.sid_token_ids.tolist() == expected
    queries = torch.tensor(
        [*expected[::-1], sid_ids(tokenizer, [0, 0]), sid_ids(tokenizer, [2, 1]), [3, 4]]
    )
    assert trie.item_index(queries).tolist() == [3, 2, 1, 0, -1, -1, -1]
    # the right codes at the wrong levels are not an item
    swapped = tokenizer.convert_tokens_to_ids(["<b_1>", "<a_2>"])
    assert trie.item_index(torch.tensor([swapped])).tolist() == [-1]
    with pytest.raises(ValueError, match=r"expected \(n, 2\)"):
        trie.item_index(torch.tensor(expected[0]))


def test_from_sid_map_errors_name_the_problem(tokenizer):
    with pytest.raises(ValueError, match=r"'<b_99>' is not in the tokenizer"):
        SidTrie.from_sid_map({"x": [1, 99]}, tokenizer)
    with pytest.raises(ValueError, match=r"different lengths \[2, 3\]"):
        SidTrie.from_sid_map({"x": [1, 2], "y": [1, 2, 3]}, tokenizer)
    with pytest.raises(ValueError, match=r"items \['x', 'z'\] share"):
        SidTrie.from_sid_map({"x": [1, 2], "y": [1, 3], "z": [1, 2]}, tokenizer)
    with pytest.raises(ValueError, match="empty"):
        SidTrie.from_sid_map({}, tokenizer)


# --- generation with a tiny model ----------------------------------------------------------


def teacher_forced_scores(model, prompt: list[int], trie: SidTrie, eos: int) -> torch.Tensor:
    """Each item's log P(SID, EOS | prompt) / (L + 1): transformers' beam score."""
    n = trie.n_items
    ids = torch.cat(
        [torch.tensor(prompt).expand(n, -1), trie.sid_token_ids, torch.full((n, 1), eos)], 1
    )
    with torch.no_grad():
        logp = model(ids).logits.log_softmax(-1)
    target = ids[:, len(prompt) :]
    picked = logp[:, len(prompt) - 1 : -1].gather(2, target[:, :, None]).squeeze(2)
    return picked.sum(1) / target.shape[1]


def test_enough_beams_return_every_item_ranked_exactly(model, tokenizer):
    """With num_beams >= n_items the beam search is exhaustive: all items, in exact order."""
    sid_map = {f"i{k}": [k % 3, k // 3, (k * 7) % 5] for k in range(12)}
    trie = SidTrie.from_sid_map(sid_map, tokenizer)
    prompts = ["user watched <a_1><b_2><c_3> then Answer:", "liked Answer:"]
    out = generate_sids(
        model, tokenizer, prompts, trie, num_beams=12, top_k=12, max_prompt_tokens=64
    )
    assert out.truncated == 0
    for row, prompt in enumerate(prompts):
        exact = teacher_forced_scores(
            model, ids_of(tokenizer, prompt), trie, tokenizer.eos_token_id
        )
        assert out.items[row].tolist() == exact.argsort(descending=True).tolist()
        assert torch.allclose(out.scores[row], exact[out.items[row]], atol=1e-4)


def test_greedy_scores_match_teacher_forcing(model, tokenizer):
    trie = SidTrie.from_sid_map(SMALL_MAP, tokenizer)
    prompt = "user watched then Answer:"
    out = generate_sids(
        model, tokenizer, [prompt], trie, num_beams=1, top_k=1, max_prompt_tokens=64
    )
    exact = teacher_forced_scores(model, ids_of(tokenizer, prompt), trie, tokenizer.eos_token_id)
    item = int(out.items[0, 0])
    assert item >= 0
    assert math.isclose(float(out.scores[0, 0]), float(exact[item]), abs_tol=1e-4)


def test_processor_reused_across_generate_calls_matches_fresh_instances(model, tokenizer):
    trie = SidTrie.from_sid_map({f"i{k}": [k % 4, k % 3, k // 4] for k in range(10)}, tokenizer)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batches = [
        tokenizer(["then Answer:", "user Answer:"], return_tensors="pt"),
        tokenizer.pad(
            tokenizer(["user watched <a_1><b_0><c_2> liked then Answer:", "watched Answer:"]),
            padding_side="left",
            return_tensors="pt",
        ),
    ]
    shared = SidConstrainedLogitsProcessor(trie=trie, eos_token_id=eos)

    def run(batch, processor):
        return model.generate(
            **batch,
            logits_processor=LogitsProcessorList([processor]),
            num_beams=6,
            num_return_sequences=3,
            max_new_tokens=4,
            do_sample=False,
            early_stopping=True,
            pad_token_id=pad,
            eos_token_id=eos,
        )

    reused = [run(b, shared) for b in batches]
    fresh = [run(b, SidConstrainedLogitsProcessor(trie=trie, eos_token_id=eos)) for b in batches]
    for batch, a, b in zip(batches, reused, fresh, strict=True):
        assert torch.equal(a, b)
        generated = a[:, batch["input_ids"].shape[1] :]
        assert (trie.item_index(generated[:, :3]) >= 0).all()
        assert (generated[:, 3] == eos).all()


@settings(max_examples=15, deadline=None, database=None)
@given(data=st.data())
def test_generated_sids_are_distinct_catalog_items(model, tokenizer, sid_maps, data):
    sids = data.draw(sid_maps(L_MAX, K_MAX), label="sids")
    sid_map = {f"i{k}": list(codes) for k, codes in enumerate(sids)}
    trie = SidTrie.from_sid_map(sid_map, tokenizer)
    num_beams = data.draw(st.integers(1, 50), label="num_beams")
    top_k = data.draw(st.integers(1, min(num_beams, len(sids))), label="top_k")
    history = st.sampled_from(
        ["user", "watched", "then", "liked", sid_string([1, 2, 3][: len(sids[0])])]
    )
    prompts = [
        " ".join(data.draw(st.lists(history, max_size=6))) + " Answer:"
        for _ in range(data.draw(st.integers(1, 6), label="batch"))
    ]
    out = generate_sids(
        model, tokenizer, prompts, trie, num_beams=num_beams, top_k=top_k, max_prompt_tokens=64
    )
    assert out.items.shape == out.scores.shape == (len(prompts), top_k)
    assert (out.items >= 0).all()
    for row in out.items.tolist():
        assert len(set(row)) == top_k
    assert (out.scores[:, :-1] >= out.scores[:, 1:] - 1e-6).all()  # best first
    assert out.scores.isfinite().all()


def test_long_prompts_are_truncated_on_the_left(model, tokenizer, caplog):
    trie = SidTrie.from_sid_map(SMALL_MAP, tokenizer)
    prompts = ["user watched then liked user watched Answer:", "liked Answer:"]
    with caplog.at_level(logging.WARNING, logger="models.constrained"):
        out = generate_sids(
            model, tokenizer, prompts, trie, num_beams=4, top_k=3, max_prompt_tokens=3
        )
    assert out.truncated == 1
    assert "1 of 2 prompts were longer than max_prompt_tokens=3" in caplog.text
    short = ["user watched Answer:", "liked Answer:"]
    same = generate_sids(model, tokenizer, short, trie, num_beams=4, top_k=3, max_prompt_tokens=3)
    assert torch.equal(out.items, same.items)
    # left-padded tensors give the same answer as strings
    encoded = tokenizer.pad(tokenizer(prompts), padding_side="left", return_tensors="pt")
    from_ids = generate_sids(
        model, tokenizer, encoded, trie, num_beams=4, top_k=3, max_prompt_tokens=3
    )
    assert torch.equal(from_ids.items, out.items) and from_ids.truncated == 1


def test_generate_rejects_bad_requests(model, tokenizer):
    trie = SidTrie.from_sid_map(SMALL_MAP, tokenizer)
    kwargs: dict[str, Any] = dict(num_beams=4, top_k=2, max_prompt_tokens=16)
    with pytest.raises(ValueError, match="ends with a SID token"):
        generate_sids(model, tokenizer, ["user <a_1><b_2>"], trie, **kwargs)
    with pytest.raises(ValueError, match="exceeds the catalog size"):
        generate_sids(
            model, tokenizer, ["Answer:"], trie, num_beams=8, top_k=5, max_prompt_tokens=16
        )
    with pytest.raises(ValueError, match="top_k <= num_beams"):
        generate_sids(
            model, tokenizer, ["Answer:"], trie, num_beams=2, top_k=3, max_prompt_tokens=16
        )
    encoded = tokenizer.pad(
        tokenizer(["user Answer:", "Answer:"]), padding_side="right", return_tensors="pt"
    )
    with pytest.raises(ValueError, match="left-padded"):
        generate_sids(model, tokenizer, encoded, trie, **kwargs)


# --- excluding items -----------------------------------------------------------------------

EXCLUSION_MAP = {f"i{k}": [k % 3, k // 3, (k * 7) % 5] for k in range(12)}
EVERYTHING = list(range(12))


def test_excluded_items_never_come_back_and_other_prompts_are_unaffected(model, tokenizer):
    """With num_beams = n_items the search is exhaustive: each prompt gets exactly its allowed
    items in the exact order, -1 / -inf after them."""
    trie = SidTrie.from_sid_map(EXCLUSION_MAP, tokenizer)
    prompts = ["user watched Answer:", "liked Answer:", "then liked Answer:", "user Answer:"]
    exclude = [
        [k for k in EVERYTHING if k % 3 == 0],  # the whole <a_0> branch
        [],
        [k for k in EVERYTHING if k not in (2, 7, 11)],  # 3 allowed items < top_k
        EVERYTHING,
    ]
    kwargs: dict[str, Any] = dict(num_beams=12, top_k=6, max_prompt_tokens=64)
    out = generate_sids(model, tokenizer, prompts, trie, exclude=exclude, **kwargs)
    for row, prompt in enumerate(prompts):
        exact = teacher_forced_scores(
            model, ids_of(tokenizer, prompt), trie, tokenizer.eos_token_id
        )
        ranked = [k for k in exact.argsort(descending=True).tolist() if k not in exclude[row]]
        n = min(6, len(ranked))
        assert out.items[row].tolist() == ranked[:n] + [-1] * (6 - n)
        assert torch.allclose(out.scores[row, :n], exact[ranked[:n]], atol=1e-4)
        assert out.scores[row, n:].isneginf().all()
    assert sorted(out.items[2, :3].tolist()) == [2, 7, 11]
    assert out.items[3].tolist() == [-1] * 6
    # the prompt without exclusions: as without any, in this batch and alone
    plain = generate_sids(model, tokenizer, prompts, trie, **kwargs)
    assert torch.equal(out.items[1], plain.items[1]) and torch.equal(out.scores[1], plain.scores[1])
    alone = generate_sids(model, tokenizer, [prompts[1]], trie, **kwargs)
    assert torch.equal(out.items[1], alone.items[0])


def test_greedy_skips_excluded_items(model, tokenizer):
    trie = SidTrie.from_sid_map(EXCLUSION_MAP, tokenizer)
    prompt = "user watched then Answer:"
    kwargs: dict[str, Any] = dict(num_beams=1, top_k=1, max_prompt_tokens=64)
    first = int(generate_sids(model, tokenizer, [prompt], trie, **kwargs).items[0, 0])
    out = generate_sids(model, tokenizer, [prompt], trie, exclude=[[first]], **kwargs)
    second = int(out.items[0, 0])
    assert second not in (first, -1)
    exact = teacher_forced_scores(model, ids_of(tokenizer, prompt), trie, tokenizer.eos_token_id)
    assert math.isclose(float(out.scores[0, 0]), float(exact[second]), abs_tol=1e-4)
    nothing = generate_sids(model, tokenizer, [prompt], trie, exclude=[EVERYTHING], **kwargs)
    assert nothing.items.tolist() == [[-1]] and nothing.scores.isneginf().all()


@settings(max_examples=15, deadline=None, database=None)
@given(data=st.data())
def test_excluded_generation_returns_every_allowed_item_it_can(model, tokenizer, sid_maps, data):
    """min(top_k, allowed) distinct allowed items first, then -1 / -inf — however few items
    are allowed, and with more beams than allowed items."""
    sids = data.draw(sid_maps(L_MAX, K_MAX), label="sids")
    trie = SidTrie.from_sid_map({f"i{k}": list(codes) for k, codes in enumerate(sids)}, tokenizer)
    num_beams = data.draw(st.integers(1, 20), label="num_beams")
    top_k = data.draw(st.integers(1, min(num_beams, len(sids))), label="top_k")
    batch = data.draw(st.integers(1, 4), label="batch")
    rows = st.integers(0, len(sids) - 1)
    exclude = [
        data.draw(st.lists(rows, max_size=len(sids) + 2), label="exclude") for _ in range(batch)
    ]
    history = st.sampled_from(["user", "watched", "then", "liked"])
    prompts = [
        " ".join(data.draw(st.lists(history, max_size=4))) + " Answer:" for _ in range(batch)
    ]
    out = generate_sids(
        model,
        tokenizer,
        prompts,
        trie,
        num_beams=num_beams,
        top_k=top_k,
        max_prompt_tokens=64,
        exclude=exclude,
    )
    assert out.items.shape == out.scores.shape == (batch, top_k)
    for items, banned in zip(out.items.tolist(), exclude, strict=True):
        valid = [i for i in items if i >= 0]
        assert len(valid) == min(top_k, len(sids) - len(set(banned)))
        assert items == valid + [-1] * (top_k - len(valid))
        assert len(set(valid)) == len(valid) and not set(valid) & set(banned)
    assert torch.equal(out.items >= 0, out.scores.isfinite())


def test_rank_items_gives_each_batch_its_exclusions(model, tokenizer):
    trie = SidTrie.from_sid_map(EXCLUSION_MAP, tokenizer)
    prompts = ["user Answer:", "liked Answer:", "then Answer:"]  # same length: no padding
    exclude = [[0, 1, 2], [], [5]]
    kwargs: dict[str, Any] = dict(num_beams=4, top_k=3, max_prompt_tokens=64)
    ranked = rank_items(model, tokenizer, prompts, trie, batch_size=2, exclude=exclude, **kwargs)
    for row, prompt in enumerate(prompts):
        alone = generate_sids(model, tokenizer, [prompt], trie, exclude=[exclude[row]], **kwargs)
        assert ranked[row].tolist() == alone.items[0].tolist()
    with pytest.raises(ValueError, match="exclude has 1 lists for 3 prompts"):
        rank_items(model, tokenizer, prompts, trie, batch_size=2, exclude=[[]], **kwargs)


def test_exclusions_must_be_trie_rows_one_list_per_prompt(model, tokenizer):
    trie = SidTrie.from_sid_map(SMALL_MAP, tokenizer)
    kwargs: dict[str, Any] = dict(num_beams=4, top_k=2, max_prompt_tokens=16)
    with pytest.raises(ValueError, match=r"one index list per score row \(2\)"):
        generate_sids(model, tokenizer, ["Answer:", "user Answer:"], trie, exclude=[[0]], **kwargs)
    with pytest.raises(
        ValueError, match=r"row 0 holds indices outside the catalog \[0, 4\) \(pass catalog rows"
    ):
        generate_sids(model, tokenizer, ["Answer:"], trie, exclude=[[4]], **kwargs)


def test_prompts_encoded_once_per_prompt_give_the_beams_of_a_plain_search(
    model, tokenizer, monkeypatch
):
    """The prompt cache shared by a prompt's beams changes nothing but the cost: same items,
    same scores as beam search that encodes every beam's prompt (prompts of different lengths,
    so left padding and positions are covered)."""
    import models.constrained as constrained

    sid_map = {f"i{k}": [k % 4, (k // 4) % 4, (k * 5) % 7] for k in range(30)}
    trie = SidTrie.from_sid_map(sid_map, tokenizer)
    prompts = [
        "user watched <a_1><b_2><c_3> then <a_0><b_1><c_4> liked Answer:",
        "liked Answer:",
        "user <a_3><b_3><c_1> Answer:",
    ]
    monkeypatch.setattr(model.config, "use_cache", False)  # as trained models are saved
    caches: list[Any] = []
    real = constrained._prompt_cache
    monkeypatch.setattr(
        constrained, "_prompt_cache", lambda *a: caches.append(real(*a)) or caches[-1]
    )
    kwargs = {"num_beams": 8, "top_k": 5, "max_prompt_tokens": 64, "exclude": [[0], [], [3, 4]]}
    shared = generate_sids(model, tokenizer, prompts, trie, **kwargs)
    (cache,) = caches  # one cache: 3 prompts x 8 beams, every prompt token but the last
    assert cache["past_key_values"].layers[0].keys.shape[0] == 3 * 8
    monkeypatch.setattr(constrained, "_prompt_cache", lambda *a: {})
    plain = generate_sids(model, tokenizer, prompts, trie, **kwargs)
    assert shared.items.tolist() == plain.items.tolist()
    assert torch.allclose(shared.scores, plain.scores, atol=1e-5)
