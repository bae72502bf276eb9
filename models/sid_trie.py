"""The catalog's semantic IDs as a prefix tree in flat, sorted tensors (O(n·L) memory).

:class:`SidTrie` answers what constrained decoding asks at every step, for all rows at once and
on any device: which node a SID prefix reaches, which tokens may follow it, which item a full
SID is, and, given per-prompt exclusions, which nodes lead only to banned items.
:mod:`models.constrained` builds the logits processor and beam search on it.

Layout. Node 0 is the root (empty prefix); every distinct SID prefix of length d ≥ 1 is a node;
one extra *dead* node stands for "not a catalog prefix". An edge is keyed by
``parent · S + rank(token)`` (S = number of distinct SID tokens); edges are kept sorted, so a
parent's children are contiguous, the edges of one level are contiguous, and node ``e + 1`` is
the child of edge ``e``. One step down the tree is one ``searchsorted`` over the edge keys.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from models.sid import level_token


class SidTrie:
    """The catalog's SIDs, as token ids, in a prefix tree that decodes on any device.

    Row ``i`` of ``sid_token_ids`` is item ``i``: :meth:`item_index` returns these rows.
    """

    _TABLES = ("_vocab", "_edge_keys", "_edge_tokens", "_offsets", "_leaf_item", "_item_leaf")
    """The decoding tables (tensors moved by :meth:`to`, counted by :attr:`nbytes`)."""

    def __init__(self, *, sid_token_ids: torch.Tensor, item_ids: Sequence[str] | None = None):
        """``sid_token_ids``: (n_items, L) integer token ids, rows distinct. ``item_ids``:
        optional item id per row (kept as :attr:`item_ids`)."""
        tokens = torch.as_tensor(sid_token_ids)
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError(
                f"sid_token_ids must be a non-empty (n_items, L) matrix, got shape {tuple(tokens.shape)}"
            )
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"sid_token_ids must hold integer token ids, got {tokens.dtype}")
        if item_ids is not None and len(item_ids) != tokens.shape[0]:
            raise ValueError(f"{len(item_ids)} item_ids for {tokens.shape[0]} SIDs")
        tokens = tokens.to(device="cpu", dtype=torch.int64).contiguous()
        if bool((tokens < 0).any()):
            raise ValueError("sid_token_ids must be non-negative token ids")
        self.sid_token_ids = tokens
        self.item_ids = tuple(item_ids) if item_ids is not None else None
        self.n_items, self.levels = tokens.shape
        self.max_token_id = int(tokens.max())

        self._vocab = torch.unique(tokens)  # sorted distinct SID token ids
        s = len(self._vocab)
        rank = torch.searchsorted(self._vocab, tokens)
        node = torch.zeros(self.n_items, dtype=torch.int64)  # every item starts at the root
        keys, n_nodes = [], 1
        for level in range(self.levels):
            key = node * s + rank[:, level]
            unique, inverse = torch.unique(key, return_inverse=True)  # sorted
            keys.append(unique)
            node = n_nodes + inverse  # child of edge e is node e + 1 (edges numbered in order)
            n_nodes += len(unique)
        if len(keys[-1]) < self.n_items:
            leaf = node - (n_nodes - len(keys[-1]))
            first = int(torch.nonzero(torch.bincount(leaf)[leaf] > 1)[0])
            same = torch.nonzero(leaf == leaf[first]).flatten().tolist()[:5]
            names = [self.item_ids[i] for i in same] if self.item_ids is not None else same
            raise ValueError(
                f"{self.n_items - len(keys[-1])} SIDs duplicate another item's; every item needs "
                f"its own SID (e.g. {'items' if self.item_ids else 'rows'} {names} share "
                f"token ids {tokens[first].tolist()}); resolve SID collisions first"
            )
        if n_nodes * s >= 2**62:
            raise ValueError(f"catalog too large for int64 trie keys ({n_nodes} nodes × {s})")
        self._edge_keys = torch.cat(keys)
        self._edge_tokens = self._vocab[self._edge_keys % s]
        self.dead_node = n_nodes
        """Node id of "not a catalog SID prefix" (no children)."""
        self._first_leaf = n_nodes - self.n_items
        # children of node v are edges offsets[v]:offsets[v+1]; leaves and dead have none
        self._offsets = torch.searchsorted(
            self._edge_keys, torch.arange(n_nodes + 2, dtype=torch.int64) * s
        )
        self.max_fanout = int((self._offsets[1:] - self._offsets[:-1]).max())
        self._leaf_item = torch.empty(self.n_items, dtype=torch.int64)
        self._leaf_item[node - self._first_leaf] = torch.arange(self.n_items)
        self._item_leaf = node  # leaf node of each item row

    @classmethod
    def from_sid_map(cls, sid_map: Mapping[str, Sequence[int]], tokenizer: Any) -> SidTrie:
        """Trie of a SID map (item id → codes), items in the map's order, codes mapped to the
        tokenizer's ids of ``level_token(level, code)``."""
        if not sid_map:
            raise ValueError("SID map is empty; nothing to constrain decoding to")
        lengths = {len(codes) for codes in sid_map.values()}
        if len(lengths) != 1:
            raise ValueError(f"SIDs have different lengths {sorted(lengths)}; all must be equal")
        codes = torch.tensor([list(c) for c in sid_map.values()], dtype=torch.int64)
        if codes.ndim != 2 or codes.shape[1] == 0:
            raise ValueError("SIDs must have at least one level")
        unk_id, unk = (
            getattr(tokenizer, "unk_token_id", None),
            getattr(tokenizer, "unk_token", None),
        )
        token_ids = torch.empty_like(codes)
        for level in range(codes.shape[1]):
            distinct = torch.unique(codes[:, level])
            ids = []
            for code in distinct.tolist():
                token = level_token(level, code)
                token_id = tokenizer.convert_tokens_to_ids(token)
                if token_id is None or (token_id == unk_id and token != unk):
                    raise ValueError(
                        f"SID token {token!r} is not in the tokenizer; add the SID tokens "
                        "(tokenizer.add_tokens) and resize the model's embeddings first"
                    )
                ids.append(token_id)
            column = codes[:, level].contiguous()
            token_ids[:, level] = torch.tensor(ids)[torch.searchsorted(distinct, column)]
        return cls(sid_token_ids=token_ids, item_ids=list(sid_map))

    def to(self, device: torch.device | str) -> SidTrie:
        """A copy whose tables live on ``device`` (itself if they already do)."""
        device = torch.device(device)
        if self._edge_keys.device == device:
            return self
        moved = copy.copy(self)
        for name in self._TABLES:
            setattr(moved, name, getattr(self, name).to(device))
        return moved

    @property
    def device(self) -> torch.device:
        return self._edge_keys.device

    @property
    def nbytes(self) -> int:
        """Bytes of the decoding tables (O(n_items · L)); ``sid_token_ids`` not counted."""
        tables = [getattr(self, name) for name in self._TABLES]
        return sum(t.numel() * t.element_size() for t in tables)

    def is_sid_token(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Boolean tensor: which entries are SID tokens (of any level)."""
        return self._ranks(token_ids)[1]

    def walk(self, prefixes: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Node reached by each row's first ``lengths[row]`` tokens (all columns if None);
        the dead node where they are not a catalog SID prefix. ``prefixes``: (rows, T)."""
        return self._walk(*self._ranks(prefixes), lengths)

    def _ranks(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank of each token among the SID tokens (clamped), and whether it is one."""
        rank = torch.searchsorted(self._vocab, token_ids.contiguous()).clamp_(
            max=len(self._vocab) - 1
        )
        return rank, self._vocab[rank] == token_ids

    def _walk(
        self, rank: torch.Tensor, is_sid: torch.Tensor, lengths: torch.Tensor | None
    ) -> torch.Tensor:
        s, last_edge = len(self._vocab), len(self._edge_keys) - 1
        node = torch.zeros(rank.shape[0], dtype=torch.int64, device=rank.device)
        for j in range(rank.shape[1]):
            key = node * s + rank[:, j]
            edge = torch.searchsorted(self._edge_keys, key).clamp_(max=last_edge)
            found = is_sid[:, j] & (self._edge_keys[edge] == key)
            # the dead node has no edges, so once dead a row stays dead
            child = torch.where(found, edge + 1, self.dead_node)
            node = child if lengths is None else torch.where(j < lengths, child, node)
        return node

    def item_index(self, generated_token_ids: torch.Tensor) -> torch.Tensor:
        """(n, L) SID token ids → (n,) item row, -1 where the SID is not in the catalog."""
        if generated_token_ids.ndim != 2 or generated_token_ids.shape[1] != self.levels:
            raise ValueError(
                f"expected (n, {self.levels}) SID token ids, got {tuple(generated_token_ids.shape)}"
            )
        node = self.walk(generated_token_ids.to(device=self.device, dtype=torch.int64))
        leaf = node - self._first_leaf
        is_leaf = (leaf >= 0) & (node < self.dead_node)
        return torch.where(is_leaf, self._leaf_item[leaf.clamp(0, self.n_items - 1)], -1)

    def allowed_next(self, node: torch.Tensor, eos_token_id: int) -> torch.Tensor:
        """(rows, max_fanout) token ids allowed after each node, repeated to fill the row
        (leaves and the dead node: EOS only)."""
        return self._next(node, eos_token_id)[0]

    def _next(self, node: torch.Tensor, eos_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`allowed_next`, and the child node each token leads to (dead for EOS)."""
        start = self._offsets[node]
        count = self._offsets[node + 1] - start
        cols = torch.arange(self.max_fanout, device=node.device)
        idx = torch.minimum(start[:, None] + cols, (start + count - 1)[:, None]).clamp_(min=0)
        has = count[:, None] > 0
        return (
            torch.where(has, self._edge_tokens[idx], eos_token_id),
            torch.where(has, idx + 1, self.dead_node),
        )

    def banned_nodes(self, banned: torch.Tensor) -> torch.Tensor:
        """(batch, n_items) bool, True = item row banned → (batch, n_nodes + 1) bool over the
        nodes, the dead node last (always banned). A node is banned when all its children are,
        so a decoder that skips banned children never spends a beam on a branch that can only
        end in banned items. Computed bottom-up over the banned nodes only (a parent is banned
        when as many of its children are): a pass over every node per level made these tables
        the catalog-size cost of each ``generate_sids`` call (bench/scale.py)."""
        if banned.dtype != torch.bool or banned.ndim != 2 or banned.shape[1] != self.n_items:
            raise ValueError(
                f"banned must be a (batch, {self.n_items}) bool tensor, "
                f"got {banned.dtype} {tuple(banned.shape)}"
            )
        width = self.dead_node + 1
        out = torch.zeros(len(banned), width, dtype=torch.bool, device=self.device)
        out[:, self.dead_node] = True
        row, item = torch.nonzero(banned.to(self.device), as_tuple=True)
        node = self._item_leaf[item]
        out[row, node] = True
        order = torch.argsort(row * width + node)  # by (row, node)
        row, node = row[order], node[order]
        children = self._offsets[1:] - self._offsets[:-1]
        for _ in range(self.levels):  # children before parents, up to the root
            parent = self._edge_keys[node - 1] // len(self._vocab)  # node v is edge v - 1's child
            # parents ascend with their children's ids (edges are sorted), so keys stay sorted
            key, count = torch.unique_consecutive(row * width + parent, return_counts=True)
            full = count == children[key % width]
            row, node = key[full] // width, key[full] % width
            out[row, node] = True
        return out
