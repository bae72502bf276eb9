"""Non-generative baselines (popularity, SASRec) and the data preparation they share.

Baselines read the split files (``sidrec.schemas.SPLIT``: user_id, history, target,
timestamp) and the item catalog (a list of item_id strings; catalog order = item index).
The helpers here turn those into item indices and rebuild each user's training sequence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

SPLIT_COLUMNS = ("user_id", "history", "target", "timestamp")


def catalog_index(item_ids: Sequence[str]) -> dict[str, int]:
    """item_id → index (catalog order); the catalog must be non-empty and without repeats."""
    if len(item_ids) == 0:
        raise ValueError("the item catalog is empty; pass the item_ids of items.parquet")
    index = {str(item): i for i, item in enumerate(item_ids)}
    if len(index) != len(item_ids):
        repeated = Counter(str(i) for i in item_ids).most_common(1)[0][0]
        raise ValueError(f"the item catalog lists item_id {repeated!r} more than once")
    return index


def check_split(df: pd.DataFrame, name: str) -> None:
    """Raise if ``df`` lacks the split columns or has no rows."""
    missing = [c for c in SPLIT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"the {name} split lacks columns {missing}; expected {list(SPLIT_COLUMNS)} "
            "(data/processed/<dataset>/<split>.parquet)"
        )
    if len(df) == 0:
        raise ValueError(f"the {name} split is empty; nothing to train or evaluate on")


def encode_histories(
    histories: Sequence[Sequence[Any]], index: dict[str, int], name: str = "histories"
) -> list[list[int]]:
    """Histories of item_id strings (or already item indices) → lists of item indices.

    Raises ``ValueError`` naming the first row holding an item outside the catalog.
    """
    n_items = len(index)
    encoded: list[list[int]] = []
    for row, history in enumerate(histories):
        try:
            encoded.append([_encode_item(item, index, n_items) for item in history])
        except KeyError as exc:
            raise ValueError(
                f"{name} row {row} holds item {exc.args[0]!r}, which is not in the catalog "
                f"of {n_items} items; filter the rows or rebuild the catalog"
            ) from None
    return encoded


def encode_targets(
    targets: Sequence[Any], index: dict[str, int], name: str = "targets"
) -> np.ndarray:
    """Targets (item_id strings or indices) → int64 array of item indices."""
    rows = encode_histories([[t] for t in targets], index, name)
    return np.asarray([row[0] for row in rows], dtype=np.int64)


def _encode_item(item: Any, index: dict[str, int], n_items: int) -> int:
    if isinstance(item, int | np.integer) and not isinstance(item, bool):
        if not 0 <= item < n_items:
            raise KeyError(item)
        return int(item)
    return index[item]  # KeyError for unknown ids (and for non-str, non-int items)


def train_sequences(train: pd.DataFrame) -> list[list[str]]:
    """Each user's item sequence, rebuilt from the train rows (which only keep capped histories).

    Rows of a user are visited by timestamp (ties: file order, which the split writes by
    position). A row extends the current chain when its history equals the chain's tail
    (leave-one-out and sliding-window train rows of a user are prefixes of one sequence, so
    this yields that sequence: first history + every target); otherwise it starts a new
    chain from its own history and target. No transition is ever invented, and every
    train interaction appears exactly once when rows chain up.
    """
    check_split(train, "train")
    ordered = train.sort_values(["user_id", "timestamp"], kind="stable")
    chains: list[list[str]] = []
    current_user: object = None
    for user, history, target in zip(
        ordered["user_id"], ordered["history"], ordered["target"], strict=True
    ):
        history = [str(i) for i in history]
        chain = chains[-1] if chains and user == current_user else None
        if chain is not None and history and chain[-len(history) :] == history:
            chain.append(str(target))
        else:
            chains.append([*history, str(target)])
        current_user = user
    return chains
