"""SidConstrainedLogitsProcessor on raw token ids (no tokenizer, no model): which tokens each
row may take next, bans per prompt, and a brute-force prefix dictionary to compare with."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.constrained import SidConstrainedLogitsProcessor
from models.sid_trie import SidTrie

L_MAX, K_MAX = 4, 16  # levels and codes per level of the random SID maps


def finite_columns(scores: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(row.isfinite()).flatten().tolist() for row in scores]


# --- the trie and the processor: argument checks -------------------------------------------


def test_constructor_errors():
    with pytest.raises(ValueError, match="non-empty"):
        SidTrie(sid_token_ids=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="integer"):
        SidTrie(sid_token_ids=torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="non-negative"):
        SidTrie(sid_token_ids=torch.tensor([[1, -2]]))
    with pytest.raises(ValueError, match=r"rows \[0, 1\] share token ids \[5, 6\]"):
        SidTrie(sid_token_ids=torch.tensor([[5, 6], [5, 6]]))
    with pytest.raises(ValueError, match="2 item_ids for 1 SIDs"):
        SidTrie(sid_token_ids=torch.tensor([[5, 6]]), item_ids=["a", "b"])
    trie = SidTrie(sid_token_ids=torch.tensor([[5, 6]]))
    with pytest.raises(ValueError, match="eos_token_id 6 is a SID token"):
        SidConstrainedLogitsProcessor(trie=trie, eos_token_id=6)
    processor = SidConstrainedLogitsProcessor(trie=trie, eos_token_id=1)
    with pytest.raises(ValueError, match="resize the model's embeddings"):
        processor(torch.tensor([[0]]), torch.zeros(1, 6))


def test_table_memory_grows_linearly_with_the_catalog():
    small = SidTrie(sid_token_ids=torch.arange(300).view(100, 3))
    large = SidTrie(sid_token_ids=torch.arange(3000).view(1000, 3))
    assert 9 < large.nbytes / small.nbytes < 11


# --- the processor, token ids only ---------------------------------------------------------

# items 100-101-102, 100-101-103, 100-104-102, 105-101-102; prompt tokens < 10, EOS = 1
TRIE = SidTrie(
    sid_token_ids=torch.tensor([[100, 101, 102], [100, 101, 103], [100, 104, 102], [105, 101, 102]])
)
EOS = 1


def test_rows_at_different_steps_in_one_call():
    rows = [
        [0, 0, 0, 0, 7],  # step 0
        [0, 0, 0, 7, 100],  # step 1
        [0, 0, 7, 100, 101],  # step 2
        [0, 7, 100, 101, 103],  # step 3 = L: EOS only
        [0, 0, 0, 7, 105],  # step 1, another branch
        [0, 0, 7, 105, 104],  # not a catalog prefix: EOS only
        [101, 100, 101, 103, 102],  # 4 SID tokens in a row (> L): EOS only
        [0, 0, 7, 104, 102],  # level-1 token at level 0: EOS only
        [0, 7, 2, 100, 104],  # step 2 after a non-SID history token
    ]
    scores = torch.randn(len(rows), 110)
    out = SidConstrainedLogitsProcessor(trie=TRIE, eos_token_id=EOS)(
        torch.tensor(rows), scores.clone()
    )
    expected = [[100, 105], [101, 104], [102, 103], [EOS], [101], [EOS], [EOS], [EOS], [102]]
    assert finite_columns(out) == expected
    for row, cols in enumerate(expected):
        assert torch.equal(out[row, cols], scores[row, cols])  # kept scores are unchanged
        assert (out[row].isinf() | out[row].isfinite()).all()
        assert int(out[row].isneginf().sum()) == 110 - len(cols)


def test_eos_forced_after_l_tokens_and_short_inputs():
    processor = SidConstrainedLogitsProcessor(trie=TRIE, eos_token_id=EOS)
    # inputs shorter than L + 1 columns, one row already a full SID
    out = processor(torch.tensor([[100, 101, 102], [3, 100, 104]]), torch.zeros(2, 110))
    assert finite_columns(out) == [[EOS], [102]]
    out = processor(torch.tensor([[3]]), torch.zeros(1, 110))
    assert finite_columns(out) == [[100, 105]]


def test_inplace_overwrites_scores_and_copy_leaves_them():
    scores = torch.randn(2, 110)
    before = scores.clone()
    ids = torch.tensor([[3, 100], [3, 105]])
    copied = SidConstrainedLogitsProcessor(trie=TRIE, eos_token_id=EOS, inplace=False)(ids, scores)
    assert torch.equal(scores, before) and copied.data_ptr() != scores.data_ptr()
    out = SidConstrainedLogitsProcessor(trie=TRIE, eos_token_id=EOS)(ids, scores)
    assert out.data_ptr() == scores.data_ptr() and torch.equal(out, copied)


def test_banned_branches_are_skipped_per_prompt():
    """Rows are batch × beams in order; each row sees only its own prompt's bans."""
    banned_items = torch.tensor(
        [
            [True, True, False, False],  # prompt 0: both items under 100-101
            [False, False, False, True],  # prompt 1: the only item under 105
            [True, True, True, True],  # prompt 2: everything
        ]
    )
    processor = SidConstrainedLogitsProcessor(
        trie=TRIE, eos_token_id=EOS, banned_nodes=TRIE.banned_nodes(banned_items)
    )
    rows = [
        [0, 0, 7],  # prompt 0, beam 0: root
        [0, 7, 100],  # prompt 0, beam 1: 100-101 is banned, 100-104 is not
        [7, 100, 101],  # prompt 1, beam 0: nothing banned below
        [0, 0, 7],  # prompt 1, beam 1: 105 is banned
        [0, 0, 7],  # prompt 2, beam 0: the root is banned: EOS only
        [7, 100, 101],  # prompt 2, beam 1: inside a banned node: EOS only
    ]
    scores = torch.randn(len(rows), 110)
    out = processor(torch.tensor(rows), scores.clone())
    expected = [[100, 105], [104], [102, 103], [100], [EOS], [EOS]]
    assert finite_columns(out) == expected
    for row, cols in enumerate(expected):
        assert torch.equal(out[row, cols], scores[row, cols])
    # stateless: the same call again, and the same prompts with 1 beam per prompt
    assert torch.equal(processor(torch.tensor(rows), scores.clone()), out)
    single = processor(torch.tensor(rows[::2]), scores[::2].clone())
    assert finite_columns(single) == [[100, 105], [102, 103], [EOS]]
    with pytest.raises(ValueError, match="5 score rows are not num_beams rows for 3 prompts"):
        processor(torch.tensor(rows[:5]), scores[:5].clone())


def test_banned_nodes_must_come_from_the_trie():
    with pytest.raises(ValueError, match=r"banned_nodes must be a \(batch, 11\) bool tensor"):
        SidConstrainedLogitsProcessor(
            trie=TRIE, eos_token_id=EOS, banned_nodes=torch.zeros(2, 12, dtype=torch.bool)
        )


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data())
def test_processor_matches_a_prefix_dictionary(sid_maps, data):
    """The allowed set of every row equals a brute-force prefix → next-token dictionary's."""
    sids = data.draw(sid_maps(L_MAX, K_MAX), label="sids")
    levels = len(sids[0])
    tokens = torch.tensor(sids) + 100 + 20 * torch.arange(levels)  # level l: 100 + 20 l + code
    trie = SidTrie(sid_token_ids=tokens)
    nexts: dict[tuple[int, ...], set[int]] = {}
    for row in tokens.tolist():
        for t in range(levels):
            nexts.setdefault(tuple(row[:t]), set()).add(row[t])
    # tokens outside the catalog's token set are not SID tokens to the processor
    sid_token = st.sampled_from(sorted(set(tokens.flatten().tolist())))
    rows, expected = [], []
    for _ in range(data.draw(st.integers(1, 8))):
        if data.draw(st.booleans()):  # a catalog prefix
            item = tokens[data.draw(st.integers(0, len(tokens) - 1))].tolist()
            prefix = item[: data.draw(st.integers(0, levels))]
        else:  # any SID tokens, usually not a prefix
            prefix = data.draw(st.lists(sid_token, max_size=levels + 1))
        history = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=6))
        rows.append(history + prefix)
        # a full SID, a run longer than L, or not a catalog prefix: EOS only
        expected.append(sorted(nexts.get(tuple(prefix), {EOS})))
    width = max(map(len, rows))
    input_ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # left padding
    scores = torch.randn(len(rows), 100 + 20 * levels)
    out = SidConstrainedLogitsProcessor(trie=trie, eos_token_id=EOS)(input_ids, scores.clone())
    assert finite_columns(out) == expected
    for row, cols in enumerate(expected):
        assert torch.equal(out[row, cols], scores[row, cols])
