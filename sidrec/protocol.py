"""The evaluation protocol every stage shares: how a user's interactions are ordered (ties
keep the source's row order), which validation users select checkpoints and
which decide promotion, which items a user has already seen, and fingerprints that tie a
metrics file to the data and model it was computed from.

Validation halves. SFT, GRPO and SASRec pick their checkpoints on validation users; the
promotion gate must not judge on the same users, or the model that overfits the selection
noise wins. So the validation users are split once into a *selection* half and a *gate*
half by a hash of the user id: deterministic, independent of file order, and stable when a
retrain adds users (an existing user never changes half).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from sidrec.io import file_sha256

Half = Literal["selection", "gate"]
HALF_SALT = "sidrec-validation-half"


def user_sequences(inter: pd.DataFrame) -> pd.DataFrame:
    """Interactions by (user, timestamp), ties in source row order, with each row's source
    ``row``, its position ``pos`` in its user's sequence and the sequence ``length``."""
    # `row` makes the tie rule explicit rather than relying on a multi-key sort being stable
    ordered = inter.assign(row=np.arange(len(inter)))
    ordered = ordered.sort_values(["user_id", "timestamp", "row"]).reset_index(drop=True)
    ordered["pos"] = ordered.groupby("user_id", sort=False).cumcount()
    ordered["length"] = ordered.groupby("user_id", sort=False)["pos"].transform("size")
    return ordered


def catalog_fingerprint(item_ids: list[str]) -> str:
    """Hash of the catalog's item ids in order (embeddings are valid for one order only)."""
    return hashlib.sha256("\n".join(item_ids).encode()).hexdigest()


def gate_user(user_id: str) -> bool:
    """True when ``user_id`` belongs to the gate half of the validation users."""
    digest = hashlib.sha256(f"{HALF_SALT}:{user_id}".encode()).digest()
    return bool(digest[0] & 1)


def validation_half(valid: pd.DataFrame, half: Half) -> pd.DataFrame:
    """The rows of the valid split whose user is in ``half`` (row order kept)."""
    in_gate = valid["user_id"].astype(str).map(gate_user).to_numpy(dtype=bool)
    keep = in_gate if half == "gate" else ~in_gate
    return valid[keep].reset_index(drop=True)


def seen_items(
    train: pd.DataFrame, rows: pd.DataFrame, earlier: Iterable[pd.DataFrame] = ()
) -> list[list[str]]:
    """For each row of ``rows``: every item its user had before the row's target.

    That is the user's whole train history (every history item and target of their train
    rows), the row's own history, the items of the ``earlier`` splits' rows of that user
    whose target came no later than this row's (for test rows: the valid target), and the
    items of the user's earlier rows among ``rows`` themselves (a sliding-window split gives a
    user several rows, whose old items fall out of a capped history). Sorted, distinct item
    ids per row.
    """
    per_user: dict[str, set[str]] = {}
    for user, history, target in zip(
        train["user_id"], train["history"], train["target"], strict=True
    ):
        bucket = per_user.setdefault(str(user), set())
        bucket.update(str(i) for i in history)
        bucket.add(str(target))
    later: dict[
        str, list[tuple[int, set[str]]]
    ] = {}  # user → (target time, items) of earlier splits
    for df in earlier:
        for user, history, target, stamp in zip(
            df["user_id"], df["history"], df["target"], df["timestamp"], strict=True
        ):
            items = {str(i) for i in history} | {str(target)}
            later.setdefault(str(user), []).append((int(stamp), items))
    out = []
    for user, history, stamp in zip(
        rows["user_id"], rows["history"], rows["timestamp"], strict=True
    ):
        seen = set(per_user.get(str(user), ())) | {str(i) for i in history}
        for when, items in later.get(str(user), ()):
            if when <= stamp:
                seen |= items
        out.append(seen)
    own = rows.reset_index(drop=True)
    return [sorted(a | set(b)) for a, b in zip(out, items_before(own, own), strict=True)]


def in_user_order(split: pd.DataFrame) -> pd.DataFrame:
    """The split's rows by user, then timestamp, ties in file order (its index kept)."""
    return split.assign(_row=np.arange(len(split))).sort_values(["user_id", "timestamp", "_row"])


def items_before(split: pd.DataFrame, rows: pd.DataFrame) -> list[list[str]]:
    """For each row of ``rows`` (rows of ``split``, with ``split``'s index): every item its user
    had before the row's target within ``split``, i.e. the row's own history and the history
    items and targets of the user's earlier rows (by timestamp, ties in file order). Sorted,
    distinct item ids per row.

    :func:`seen_items` serves rows of a later split, where the whole train history is in the
    past; a train row's later targets are its future, so they are not in its list here.
    """
    wanted = set(rows.index)
    ordered = in_user_order(split)
    before: dict[object, list[str]] = {}
    seen: set[str] = set()
    user: object = None
    for index, row_user, history, target in zip(
        ordered.index, ordered["user_id"], ordered["history"], ordered["target"], strict=True
    ):
        if row_user != user:
            seen, user = set(), row_user
        seen.update(str(i) for i in history)
        if index in wanted:
            before[index] = sorted(seen)
        seen.add(str(target))
    return [before[index] for index in rows.index]


def items_after(split: pd.DataFrame, rows: pd.DataFrame, count: int) -> list[list[str]]:
    """For each row of ``rows`` (rows of ``split``, with ``split``'s index): the row's target and
    the targets of its user's next ``count - 1`` rows within ``split``, in order (by timestamp,
    ties in file order, as :func:`items_before`). Fewer where the user's rows run out."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    ordered = in_user_order(split)
    targets = [str(t) for t in ordered["target"]]
    users = ordered["user_id"].to_numpy()
    position = {index: p for p, index in enumerate(ordered.index)}
    after: list[list[str]] = []
    for index in rows.index:
        start = position[index]
        end = start + 1
        while end < min(start + count, len(targets)) and users[end] == users[start]:
            end += 1
        after.append(targets[start:end])
    return after


def fingerprint(files: Iterable[Path]) -> str:
    """A short content hash of files (a folder counts as all the files inside it)."""
    digest = hashlib.sha256()
    for path in files:
        members = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for member in members:
            digest.update(member.name.encode())
            digest.update(file_sha256(member).encode())
    return digest.hexdigest()[:16]
