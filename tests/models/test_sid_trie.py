"""SidTrie.banned_nodes: which trie nodes lead only to a prompt's banned items."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.sid_trie import SidTrie

# items 100-101-102, 100-101-103, 100-104-102, 105-101-102
TRIE = SidTrie(
    sid_token_ids=torch.tensor([[100, 101, 102], [100, 101, 103], [100, 104, 102], [105, 101, 102]])
)


def node_of(trie: SidTrie, prefix: list[int]) -> int:
    return int(trie.walk(torch.tensor([prefix], dtype=torch.int64).view(1, len(prefix)))[0])


def test_inner_node_is_banned_only_when_all_its_children_are():
    banned = torch.tensor(
        [
            [True, True, False, False],  # both items under 100-101
            [True, False, False, False],  # one of them: 100-101 survives
            [True, True, True, True],  # everything
            [False, False, False, False],  # nothing
        ]
    )
    out = TRIE.banned_nodes(banned)
    assert out.shape == (4, TRIE.dead_node + 1) and out.dtype == torch.bool
    assert out[:, TRIE.dead_node].all()  # the dead node is always banned

    def flags(prefix: list[int]) -> list[bool]:
        return out[:, node_of(TRIE, prefix)].tolist()

    assert flags([100, 101, 102]) == [True, True, True, False]  # leaf = its item
    assert flags([100, 101, 103]) == [True, False, True, False]
    assert flags([100, 101]) == [True, False, True, False]  # all children banned
    assert flags([100]) == [False, False, True, False]  # 100-104 survives
    assert flags([105, 101]) == [False, False, True, False]
    assert flags([]) == [False, False, True, False]  # the root: only when every item is
    assert int(out[3].sum()) == 1  # nothing banned: only the dead node


def test_banned_nodes_rejects_a_wrong_mask():
    with pytest.raises(ValueError, match=r"\(batch, 4\) bool tensor"):
        TRIE.banned_nodes(torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool tensor"):
        TRIE.banned_nodes(torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="bool tensor"):
        TRIE.banned_nodes(torch.zeros(4, dtype=torch.bool))


sids_and_bans = st.integers(1, 4).flatmap(
    lambda levels: st.integers(1, 6).flatmap(
        lambda k: st.lists(
            st.tuples(*[st.integers(0, k - 1)] * levels),
            min_size=1,
            max_size=min(40, k**levels),
            unique=True,
        ).flatmap(
            lambda sids: st.tuples(
                st.just(sids),
                st.lists(
                    st.lists(st.booleans(), min_size=len(sids), max_size=len(sids)),
                    min_size=1,
                    max_size=4,
                ),
            )
        )
    )
)


@settings(max_examples=100, deadline=None, database=None)
@given(case=sids_and_bans)
def test_banned_nodes_match_a_brute_force_over_prefixes(case):
    """Every node is a distinct SID prefix; it is banned iff every item with that prefix is."""
    sids, bans = case
    levels = len(sids[0])
    tokens = torch.tensor(sids) + 100 + 10 * torch.arange(levels)  # level l: 100 + 10 l + code
    trie = SidTrie(sid_token_ids=tokens)
    banned = torch.tensor(bans)
    expected = torch.zeros(len(bans), trie.dead_node + 1, dtype=torch.bool)
    expected[:, trie.dead_node] = True
    seen = set()
    rows = tokens.tolist()
    for prefix in {tuple(row[:d]) for row in rows for d in range(levels + 1)}:
        below = [i for i, row in enumerate(rows) if tuple(row[: len(prefix)]) == prefix]
        node = node_of(trie, list(prefix))
        seen.add(node)
        for b, ban in enumerate(bans):
            expected[b, node] = all(ban[i] for i in below)
    assert seen == set(range(trie.dead_node))  # the prefixes cover every node once
    assert torch.equal(trie.banned_nodes(banned), expected)
