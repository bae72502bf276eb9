"""Constrained decoding of semantic IDs: a generated SID is always an item in the catalog.

The prompt ends with a non-SID token; generation then emits exactly L SID tokens and EOS.
:class:`SidTrie` holds the catalog's SIDs as a prefix tree in flat, sorted tensors (O(n·L)
memory); :class:`SidConstrainedLogitsProcessor` is a ``transformers.LogitsProcessor`` that,
at every step, keeps only the tokens that extend each row's SID prefix to a catalog SID (EOS
once the SID is complete). It is stateless — the step is read from ``input_ids`` — and
vectorized over all batch × beam rows. :func:`generate_sids` runs beam search with it.

Trie layout. Node 0 is the root (empty prefix); every distinct SID prefix of length d ≥ 1 is
a node; one extra *dead* node stands for "not a catalog prefix". An edge is keyed by
``parent · S + rank(token)`` (S = number of distinct SID tokens); edges are kept sorted, so a
parent's children are contiguous and node ``e + 1`` is the child of edge ``e``. One step down
the tree is one ``searchsorted`` over the edge keys.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from models.sid import level_token

logger = logging.getLogger(__name__)


class SidTrie:
    """The catalog's SIDs, as token ids, in a prefix tree that decodes on any device.

    Row ``i`` of ``sid_token_ids`` is item ``i``: :meth:`item_index` returns these rows.
    """

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
        for name in ("_vocab", "_edge_keys", "_edge_tokens", "_offsets", "_leaf_item"):
            setattr(moved, name, getattr(self, name).to(device))
        return moved

    @property
    def device(self) -> torch.device:
        return self._edge_keys.device

    @property
    def nbytes(self) -> int:
        """Bytes of the decoding tables (O(n_items · L)); ``sid_token_ids`` not counted."""
        tables = (self._vocab, self._edge_keys, self._edge_tokens, self._offsets, self._leaf_item)
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
        start = self._offsets[node]
        count = self._offsets[node + 1] - start
        cols = torch.arange(self.max_fanout, device=node.device)
        idx = torch.minimum(start[:, None] + cols, (start + count - 1)[:, None]).clamp_(min=0)
        return torch.where(count[:, None] > 0, self._edge_tokens[idx], eos_token_id)


class SidConstrainedLogitsProcessor(LogitsProcessor):
    """Keeps only the scores of tokens that continue each row towards a catalog SID.

    The step of each row is the number of SID tokens at the end of its ``input_ids`` (the
    prompt ends with a non-SID token), so one instance serves any number of ``generate``
    calls, prompt lengths and left padding, and rows may be at different steps. At step t < L
    the row may emit the level-t tokens that extend its prefix to a catalog SID; at t = L only
    EOS. A row whose tokens are not a catalog prefix (only if something upstream is broken)
    gets EOS only rather than being left unconstrained: generation ends and the caller sees the
    invalid SID as ``trie.item_index(...) == -1``. Costs O(rows · max_fanout) gathers plus one
    in-place fill of ``scores``; no (rows × vocab) mask, no host sync.

    ``inplace=True`` (default) overwrites and returns ``scores``: right for beam search, whose
    scores are a fresh log-softmax. Greedy search and sampling hand over the very tensor they
    keep as ``output_logits``; with ``output_logits=True`` there, pass ``inplace=False`` (one
    rows × vocab copy per step), as transformers' own processors do since PR #29680.
    """

    def __init__(self, *, trie: SidTrie, eos_token_id: int, inplace: bool = True):
        if bool(trie.is_sid_token(torch.tensor([eos_token_id], device=trie.device))):
            raise ValueError(f"eos_token_id {eos_token_id} is a SID token; it must not be")
        self.trie = trie
        self.eos_token_id = int(eos_token_id)
        self.inplace = inplace
        # device copies of the trie: a cache of constant tables, not decoding state
        self._tries = {trie.device: trie}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        trie = self._tries.get(scores.device)
        if trie is None:
            trie = self._tries[scores.device] = self.trie.to(scores.device)
        vocab = scores.shape[-1]
        if max(trie.max_token_id, self.eos_token_id) >= vocab:
            raise ValueError(
                f"scores have {vocab} columns but SID/EOS token ids go up to "
                f"{max(trie.max_token_id, self.eos_token_id)}; resize the model's embeddings"
            )
        levels = trie.levels
        width = levels + 1  # one more than L: a run longer than L is not a SID prefix
        window = input_ids[:, -width:]
        if window.shape[1] < width:
            window = torch.nn.functional.pad(window, (width - window.shape[1], 0), value=-1)
        rank, is_sid = trie._ranks(window)
        step = is_sid.flip(1).to(torch.int64).cumprod(1).sum(1)  # trailing SID tokens, 0..L+1
        cols = torch.arange(levels, device=window.device)
        pos = ((width - step)[:, None] + cols).clamp_(max=width - 1)  # prefix, left-aligned
        node = trie._walk(rank.gather(1, pos), is_sid.gather(1, pos), step)
        node = torch.where(step > levels, trie.dead_node, node)
        allowed = trie.allowed_next(node, self.eos_token_id)
        kept = scores.gather(1, allowed)
        out = scores if self.inplace else torch.empty_like(scores)
        out.fill_(float("-inf"))
        return out.scatter_(1, allowed, kept)


class SidGeneration(NamedTuple):
    items: torch.Tensor
    """(batch, top_k) item rows of the trie, best first; -1 where the SID is not an item."""
    scores: torch.Tensor
    """(batch, top_k) sequence log-probability / (L + 1) (transformers' beam score)."""
    truncated: int
    """How many prompts were longer than ``max_prompt_tokens`` and lost their beginning."""


def generate_sids(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str] | Mapping[str, torch.Tensor],
    trie: SidTrie,
    *,
    num_beams: int,
    top_k: int,
    max_prompt_tokens: int,
    eos_token_id: int | None = None,
) -> SidGeneration:
    """Top-``top_k`` catalog items per prompt by constrained beam search.

    ``prompts``: strings (tokenized with the tokenizer's special tokens), or a mapping with
    left-padded ``input_ids`` and ``attention_mask``. Prompts longer than
    ``max_prompt_tokens`` keep their end (the most recent history). ``eos_token_id`` defaults
    to the tokenizer's. With ``num_beams >= top_k`` the returned items are distinct.
    The model's own ``repetition_penalty`` / ``no_repeat_ngram_size`` are switched off: they
    would rescore SIDs that share codes with the history.
    """
    if top_k < 1 or num_beams < top_k:
        raise ValueError(f"need 1 <= top_k <= num_beams, got top_k={top_k}, num_beams={num_beams}")
    if top_k > trie.n_items:
        raise ValueError(f"top_k={top_k} exceeds the catalog size ({trie.n_items} items)")
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id; pass eos_token_id")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    input_ids, attention_mask, truncated = _left_padded(prompts, tokenizer, pad, max_prompt_tokens)
    if truncated:
        logger.warning(
            "%d of %d prompts were longer than max_prompt_tokens=%d and were truncated on the left",
            truncated,
            len(input_ids),
            max_prompt_tokens,
        )
    if bool(trie.is_sid_token(input_ids[:, -1].to(trie.device)).any()):
        raise ValueError(
            "a prompt ends with a SID token; prompts must end with a non-SID token "
            "(e.g. a newline) so the decoding step can be read from the sequence"
        )
    device = model.device
    trie = trie.to(device)
    beam = num_beams > 1  # greedy keeps the processed tensor as output_logits: copy it
    processor = SidConstrainedLogitsProcessor(trie=trie, eos_token_id=eos, inplace=beam)
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        logits_processor=LogitsProcessorList([processor]),
        num_beams=num_beams,
        num_return_sequences=top_k,
        max_new_tokens=trie.levels + 1,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=eos,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        return_dict_in_generate=True,
        **(
            {"early_stopping": True, "length_penalty": 1.0, "output_scores": True}
            if beam
            else {"output_logits": True}
        ),
    )
    generated = out.sequences[:, input_ids.shape[1] :]
    if generated.shape[1] < trie.levels:  # every valid row has L SID tokens; pad the others
        generated = torch.nn.functional.pad(
            generated, (0, trie.levels - generated.shape[1]), value=pad
        )
    items = trie.item_index(generated[:, : trie.levels]).view(len(input_ids), top_k)
    if beam:
        scores = out.sequences_scores
    else:  # greedy: the same score, from the raw logits of the chosen tokens
        logp = torch.stack(out.logits, dim=1).float().log_softmax(-1)
        chosen = generated[:, : logp.shape[1], None]
        scores = logp.gather(2, chosen).squeeze(2).sum(1) / logp.shape[1]
    return SidGeneration(items, scores.view(len(input_ids), top_k), truncated)


def rank_items(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    trie: SidTrie,
    *,
    num_beams: int,
    top_k: int,
    batch_size: int,
    max_prompt_tokens: int,
) -> np.ndarray:
    """(len(prompts), top_k) catalog rows by constrained beam search, best first (-1 = invalid),
    ``batch_size`` prompts per ``generate`` call, with a progress bar."""
    from tqdm.auto import tqdm

    chunks = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="beam search", leave=False):
        with torch.no_grad():
            out = generate_sids(
                model,
                tokenizer,
                prompts[start : start + batch_size],
                trie,
                num_beams=num_beams,
                top_k=top_k,
                max_prompt_tokens=max_prompt_tokens,
            )
        chunks.append(out.items.cpu().numpy())
    return np.concatenate(chunks)


def sid_regex(sid_strings: Sequence[str]) -> str:
    """A regular expression matching exactly the given SID strings (``<a_1><b_2>...``), nested
    by shared prefix like the trie: the catalog constraint for generation backends that take a
    regex (vLLM structured outputs)."""
    tree: dict[str, Any] = {}
    for sid in sid_strings:
        node = tree
        for token in re.findall(r"<[^>]+>", sid):
            node = node.setdefault(token, {})

    def render(node: dict[str, Any]) -> str:
        parts = [re.escape(tok) + render(child) for tok, child in sorted(node.items())]
        if not parts:
            return ""
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    return render(tree)


def _left_padded(
    prompts: Sequence[str] | Mapping[str, torch.Tensor],
    tokenizer: Any,
    pad: int,
    max_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded (input_ids, attention_mask) of at most ``max_tokens`` columns, and how
    many prompts lost tokens."""
    if isinstance(prompts, Mapping):
        ids, mask = prompts["input_ids"], prompts.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        if ids.ndim != 2 or ids.shape != mask.shape or ids.shape[0] == 0:
            raise ValueError("input_ids and attention_mask must be (batch, seq) of the same shape")
        if not bool(mask[:, -1].all()):
            raise ValueError("prompts must be left-padded (attention_mask[:, -1] all 1)")
        truncated = int((mask.sum(1) > max_tokens).sum())
        return ids[:, -max_tokens:], mask[:, -max_tokens:], truncated
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    encoded = tokenizer(list(prompts))["input_ids"]
    if any(len(e) == 0 for e in encoded):
        raise ValueError("empty prompt; every prompt needs at least one token")
    truncated = sum(len(e) > max_tokens for e in encoded)
    batch = left_pad([e[-max_tokens:] for e in encoded], pad)
    return batch["input_ids"], batch["attention_mask"], truncated


def left_pad(token_ids: Sequence[Sequence[int]], pad: int) -> dict[str, torch.Tensor]:
    """Token id lists → left-padded ``input_ids`` and ``attention_mask`` (the prompts' ends align)."""
    width = max(len(e) for e in token_ids)
    ids = torch.full((len(token_ids), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(token_ids), width), dtype=torch.int64)
    for row, e in enumerate(token_ids):
        ids[row, width - len(e) :] = torch.tensor(list(e), dtype=torch.int64)
        mask[row, width - len(e) :] = 1
    return {"input_ids": ids, "attention_mask": mask}
