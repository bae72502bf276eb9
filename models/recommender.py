"""The one SID recommender: what is evaluated is what is served.

:class:`SidRecommender` holds a fine-tuned model, its tokenizer, the catalog's SID trie and
the prompt builder, and ranks catalog items for item histories by constrained beam search
(``models/constrained.py``) with per-history exclusion of items the user already has. The
evaluate stage, GRPO's validation callback, the promotion gate's re-scoring of the champion
and the served MLflow pyfunc model (``models/pyfunc.py``) all call :meth:`SidRecommender.rank`,
so one beam width, one prompt format and one exclusion rule hold everywhere.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from models.constrained import generate_sids
from models.prompts import PromptBuilder, prompt_format
from models.sid_trie import SidTrie
from sidrec.progress import ProgressBar

log = logging.getLogger(__name__)


class Ranking(NamedTuple):
    """Per history, best first."""

    items: np.ndarray
    """(rows, k) catalog rows (``item_ids`` order); -1 where fewer than k items were allowed."""
    scores: np.ndarray
    """(rows, k) beam scores (log-probability per generated token); -inf where ``items`` is -1."""
    truncated: int
    """Prompts that lost their oldest history items to fit the model's context."""


class SidRecommender:
    """Top-K catalog items for item histories, by beam search constrained to the catalog's SIDs."""

    def __init__(
        self,
        *,
        model: Any,
        tokenizer: Any,
        sid_map: Mapping[str, Sequence[int]],
        item_ids: Sequence[str],
        max_length: int,
        num_beams: int,
        max_history: int | None = None,
        batch_size: int = 16,
    ):
        """``item_ids``: the items that may be recommended, each with a SID in ``sid_map``
        (raises ValueError naming the first that has none or a SID the tokenizer lacks).
        ``max_history``: prompts keep each history's most recent items (None: all of it)."""
        missing = [i for i in item_ids if i not in sid_map]
        if missing:
            raise ValueError(f"{len(missing)} catalog item(s) have no SID, e.g. {missing[:5]}")
        if num_beams < 1 or batch_size < 1:
            raise ValueError(
                f"need num_beams >= 1 and batch_size >= 1, got {num_beams}, {batch_size}"
            )
        self.model, self.tokenizer = model, tokenizer
        self.sid_map = sid_map
        self.item_ids = list(item_ids)
        self.index = {item: row for row, item in enumerate(self.item_ids)}
        self.trie = SidTrie.from_sid_map({i: sid_map[i] for i in self.item_ids}, tokenizer)
        self.prompts = PromptBuilder(
            tokenizer=tokenizer,
            sid_map=sid_map,
            titles=dict.fromkeys(self.item_ids, ""),  # history prompts carry SIDs only
            max_length=max_length,
            fmt=prompt_format(model),  # as the model was trained
        )
        self.num_beams = num_beams
        self.max_history = max_history
        self.batch_size = batch_size

    @classmethod
    def from_dir(
        cls, path: Path, *, missing_hint: str = "run `sidrec sft` first", **kwargs: Any
    ) -> SidRecommender:
        """Load a model folder (``save_model_dir``); on the GPU when there is one."""
        from models.lm import load_model_dir

        model, tokenizer = load_model_dir(Path(path), missing_hint)
        if torch.cuda.is_available():
            model = model.to("cuda")
        return cls(model=model, tokenizer=tokenizer, **kwargs)

    def with_model(self, model: Any) -> SidRecommender:
        """The same recommender around another model object of the same tokenizer (e.g. the
        one a trainer is updating, possibly wrapped by peft)."""
        other = copy.copy(self)
        other.model = model
        return other

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def unknown_items(self, histories: Sequence[Sequence[str]]) -> dict[str, int]:
        """History items without a SID in this model's map → the first row holding each."""
        unknown: dict[str, int] = {}
        for row, history in enumerate(histories):
            for item in history:
                if item not in self.sid_map:
                    unknown.setdefault(item, row)
        return unknown

    def rank(
        self,
        histories: Sequence[Sequence[str]],
        k: int,
        *,
        exclude: Sequence[Sequence[str]] | None = None,
        progress: bool = False,
    ) -> Ranking:
        """Top-``k`` distinct catalog items per history (oldest item first).

        ``exclude``: per history, item ids that must not be recommended (e.g. everything the
        user already has; ids outside the catalog are ignored). Excluded items are removed
        inside the constrained decoding, so no beam is spent on them; when fewer than ``k``
        items remain, the row ends in -1. History items must have a SID (ValueError naming
        them otherwise). The beam width is ``max(num_beams, k)``.
        """
        if not 1 <= k <= self.n_items:
            raise ValueError(f"k must be between 1 and the catalog size {self.n_items}, got {k}")
        if exclude is not None and len(exclude) != len(histories):
            raise ValueError(f"{len(exclude)} exclusion lists for {len(histories)} histories")
        unknown = self.unknown_items(histories)
        if unknown:
            shown = ", ".join(f"{item!r} (row {row})" for item, row in list(unknown.items())[:10])
            raise ValueError(
                f"{len(unknown)} history item id(s) are not in the model's catalog "
                f"({self.n_items} items): {shown}; pass item ids from the catalog the model "
                "was trained on"
            )
        cap = self.max_history
        before = self.prompts.truncated
        prompts = [
            self.prompts.history_prompt(list(h)[-cap:] if cap else list(h)) for h in histories
        ]
        banned = None if exclude is None else [self._rows(e) for e in exclude]
        items, scores = [], []
        starts = range(0, len(prompts), self.batch_size)
        for start in ProgressBar(starts, desc="beam search", leave=False, disable=not progress):
            end = start + self.batch_size
            with torch.no_grad():
                out = generate_sids(
                    self.model,
                    self.tokenizer,
                    prompts[start:end],
                    self.trie,
                    num_beams=max(self.num_beams, k),
                    top_k=k,
                    max_prompt_tokens=self.prompts.max_prompt,
                    exclude=None if banned is None else banned[start:end],
                )
            items.append(out.items.cpu().numpy())
            scores.append(out.scores.float().cpu().numpy())
        if not prompts:
            empty = np.empty((0, k))
            return Ranking(empty.astype(np.int64), empty, 0)
        ranked = np.concatenate(items).astype(np.int64)
        score = np.where(ranked >= 0, np.concatenate(scores), -np.inf)
        return Ranking(ranked, score, self.prompts.truncated - before)

    def _rows(self, item_ids: Sequence[str]) -> list[int]:
        return [self.index[i] for i in item_ids if i in self.index]
