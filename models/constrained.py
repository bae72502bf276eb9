"""Constrained decoding of semantic IDs: a generated SID is always an item in the catalog.

The prompt ends with a non-SID token; generation then emits exactly L SID tokens and EOS.
:class:`~models.sid_trie.SidTrie` holds the catalog's SIDs as a prefix tree;
:class:`SidConstrainedLogitsProcessor` is a ``transformers.LogitsProcessor`` that, at every
step, keeps only the tokens that extend each row's SID prefix to a catalog SID (EOS once the
SID is complete), optionally skipping branches that hold only a prompt's excluded items. It is
stateless — the step is read from ``input_ids`` — and vectorized over all batch × beam rows.
:func:`generate_sids` runs beam search with it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from models.metrics import exclusion_mask
from models.sid_trie import SidTrie
from sidrec.progress import ProgressBar

logger = logging.getLogger(__name__)


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

    ``banned_nodes`` (``trie.banned_nodes(...)``, one row per prompt) also drops tokens that
    lead into a banned node. Row r belongs to prompt ``r // (rows // batch)``: beam search lays
    out batch × num_beams rows in order, so the factor is read from the shapes of each call. A
    row already inside a banned node (only a beam forced there by -inf scores, or the root when
    every item is banned) gets EOS only, like a dead row: beam search always has a token to
    pick, and the caller drops the result (see :func:`generate_sids`).
    """

    def __init__(
        self,
        *,
        trie: SidTrie,
        eos_token_id: int,
        inplace: bool = True,
        banned_nodes: torch.Tensor | None = None,
    ):
        if bool(trie.is_sid_token(torch.tensor([eos_token_id], device=trie.device))):
            raise ValueError(f"eos_token_id {eos_token_id} is a SID token; it must not be")
        if banned_nodes is not None and (
            banned_nodes.dtype != torch.bool
            or banned_nodes.ndim != 2
            or banned_nodes.shape[1] != trie.dead_node + 1
        ):
            raise ValueError(
                f"banned_nodes must be a (batch, {trie.dead_node + 1}) bool tensor from "
                f"trie.banned_nodes(...), got {banned_nodes.dtype} {tuple(banned_nodes.shape)}"
            )
        self.trie = trie
        self.eos_token_id = int(eos_token_id)
        self.inplace = inplace
        self.banned_nodes = banned_nodes
        # device copies of the tables: a cache of constants, not decoding state
        self._tables = {trie.device: (trie, banned_nodes)}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tables = self._tables.get(scores.device)
        if tables is None:
            banned = self.banned_nodes
            tables = (
                self.trie.to(scores.device),
                None if banned is None else banned.to(scores.device),
            )
            self._tables[scores.device] = tables
        trie, banned = tables
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
        if banned is not None:
            rows, batch = len(scores), len(banned)
            if batch == 0 or rows % batch:
                raise ValueError(f"{rows} score rows are not num_beams rows for {batch} prompts")
            prompt = torch.arange(rows, device=scores.device) // (rows // batch)
            node = torch.where(banned[prompt, node], trie.dead_node, node)
        allowed, child = trie._next(node, self.eos_token_id)
        kept = scores.gather(1, allowed)
        if banned is not None:  # EOS leads to the (banned) dead node but stays allowed
            kept.masked_fill_(
                banned[prompt[:, None], child] & (allowed != self.eos_token_id), float("-inf")
            )
        out = scores if self.inplace else torch.empty_like(scores)
        out.fill_(float("-inf"))
        return out.scatter_(1, allowed, kept)


class SidGeneration(NamedTuple):
    items: torch.Tensor
    """(batch, top_k) item rows of the trie, best first; -1 where the SID is not an item (with
    ``exclude``: the allowed items first, -1 after them)."""
    scores: torch.Tensor
    """(batch, top_k) sequence log-probability / (L + 1) (transformers' beam score); with
    ``exclude``, -inf where ``items`` is -1."""
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
    exclude: Sequence[Sequence[int]] | None = None,
) -> SidGeneration:
    """Top-``top_k`` catalog items per prompt by constrained beam search.

    ``prompts``: strings (tokenized with the tokenizer's special tokens), or a mapping with
    left-padded ``input_ids`` and ``attention_mask``. Prompts longer than
    ``max_prompt_tokens`` keep their end (the most recent history). ``eos_token_id`` defaults
    to the tokenizer's. With ``num_beams >= top_k`` the returned items are distinct.
    The model's own ``repetition_penalty`` / ``no_repeat_ngram_size`` are switched off: they
    would rescore SIDs that share codes with the history.

    ``exclude``: per prompt, item rows never to return (e.g. the user's history). Beams skip
    branches that hold only excluded items; the result keeps each prompt's allowed, distinct
    items first (in beam order) and fills the rest with -1 / -inf, so a prompt with fewer
    than ``top_k`` allowed items gets fewer. ``exclude=None`` leaves the result untouched.
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
    banned = None if exclude is None else exclusion_mask(exclude, len(input_ids), trie.n_items)
    beam = num_beams > 1  # greedy keeps the processed tensor as output_logits: copy it
    processor = SidConstrainedLogitsProcessor(
        trie=trie,
        eos_token_id=eos,
        inplace=beam,
        banned_nodes=None if banned is None else trie.banned_nodes(banned),
    )
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    shared = _prompt_cache(model, input_ids, attention_mask, num_beams) if beam else {}
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        **shared,
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
    scores = scores.view(len(input_ids), top_k)
    if banned is not None:
        items, scores = _keep_allowed(items, scores, banned.to(items.device))
    return SidGeneration(items, scores, truncated)


def _prompt_cache(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_beams: int
) -> dict[str, Any]:
    """The key/value cache of every prompt but its last token, computed once per prompt and
    repeated for its beams: ``generate`` would otherwise encode each prompt ``num_beams`` times
    (it repeats the prompts before its first forward pass), most of a beam search's cost when
    prompts are long and completions are L + 1 tokens. ``generate`` then reads only the last
    prompt token. Positions are those ``generate`` derives from the attention mask, so the
    result is the same as without the cache (up to floating-point summation order)."""
    from transformers import DynamicCache

    # what generate() reads (a model saved after training may say use_cache: false in its config)
    generation = getattr(model, "generation_config", None)
    if input_ids.shape[1] < 2 or not getattr(generation, "use_cache", True):
        return {}
    head, mask = input_ids[:, :-1], attention_mask[:, :-1]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(
            input_ids=head,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
    cache.batch_repeat_interleave(num_beams)
    return {"past_key_values": cache}


def _keep_allowed(
    items: torch.Tensor, scores: torch.Tensor, banned: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Items that are invalid, banned or a repeat of an earlier one in their row become -1
    (score -inf); the rest move to the front in their order. Beams that had no allowed item
    left (too few allowed items for num_beams) end in exactly such rows."""
    ok = (items >= 0) & ~banned.gather(1, items.clamp(min=0))
    ok &= ~(items[:, :, None] == items[:, None, :]).tril(-1).any(2)  # an earlier equal item
    order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices  # kept ones first
    items = torch.where(ok, items, -1).gather(1, order)
    return items, torch.where(ok, scores, float("-inf")).gather(1, order)


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
    exclude: Sequence[Sequence[int]] | None = None,
) -> np.ndarray:
    """(len(prompts), top_k) catalog rows by constrained beam search, best first (-1 = invalid
    or, with ``exclude``, missing), ``batch_size`` prompts per ``generate`` call, with a
    progress bar. ``exclude``: item rows to leave out, one list per prompt."""
    if exclude is not None and len(exclude) != len(prompts):
        raise ValueError(f"exclude has {len(exclude)} lists for {len(prompts)} prompts")
    chunks = []
    for start in ProgressBar(range(0, len(prompts), batch_size), desc="beam search", leave=False):
        with torch.no_grad():
            out = generate_sids(
                model,
                tokenizer,
                prompts[start : start + batch_size],
                trie,
                num_beams=num_beams,
                top_k=top_k,
                max_prompt_tokens=max_prompt_tokens,
                exclude=None if exclude is None else exclude[start : start + batch_size],
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
