"""Bring-your-own-data: interactions and items as CSV or Parquet files."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sidrec.sources.common import (
    ITEM_TEXT_FIELDS,
    SourceTables,
    finish,
    normalize_ids,
    parse_ratings,
    parse_timestamps,
    read_frame,
    refuse_rows,
    require_columns,
)

log = logging.getLogger(__name__)

INTERACTION_COLUMNS = ("user_id", "item_id", "timestamp")
ITEM_COLUMNS = ("item_id", "title")
LIST_TYPES = (list, tuple, np.ndarray)
"""What a Parquet list column's cells are once in pandas."""


def read_tabular(
    interactions_path: Path, items_path: Path, min_rating: float | None = None
) -> SourceTables:
    """Interactions (user_id, item_id, timestamp[, rating]) and items (item_id, title[, description,
    brand, categories, ...]). Extra item columns are kept as text fields, except binary ones
    (an image column, say) and CSV columns with no header name (a saved pandas index), which
    are dropped; lists in text fields are joined with ", "."""
    inter = read_frame(interactions_path, "interactions")
    require_columns(inter, INTERACTION_COLUMNS, interactions_path, "interactions")
    items = read_frame(items_path, "items")
    require_columns(items, ITEM_COLUMNS, items_path, "items")
    used = [*INTERACTION_COLUMNS, *(["rating"] if "rating" in inter.columns else [])]
    _reject_binary(inter, used, interactions_path)
    notes = {
        "blank_header_columns_dropped": sum(
            frame.attrs.get("blank_header_columns_dropped", 0) for frame in (inter, items)
        )
    }
    items = _drop_binary_extras(items, items_path, notes)
    _reject_binary(items, list(items.columns), items_path)

    interactions = pd.DataFrame(
        {
            "user_id": _ids(inter, "user_id", interactions_path),
            "item_id": _ids(inter, "item_id", interactions_path),
            "timestamp": parse_timestamps(inter["timestamp"], interactions_path, "timestamp"),
        }
    )
    if "rating" in inter.columns:
        interactions["rating"] = parse_ratings(inter["rating"], interactions_path, "rating")

    catalog = pd.DataFrame({"item_id": _ids(items, "item_id", items_path)})
    catalog["title"] = _text(items["title"]).str.strip()
    for col in items.columns:
        if col not in ("item_id", "title"):
            catalog[col] = _text(items[col])
    # keep the documented text fields first for readability
    ordered = [c for c in ITEM_TEXT_FIELDS if c in catalog.columns]
    catalog = catalog[
        ["item_id", *ordered, *[c for c in catalog.columns if c not in ("item_id", *ordered)]]
    ]
    return finish(
        interactions,
        catalog,
        {"interactions": [interactions_path], "items": [items_path]},
        min_rating,
        notes=notes,
    )


def _cells(values: pd.Series, test: Callable[[Any], bool]) -> pd.Series:
    """Which cells pass ``test``. Only Parquet gives object columns of non-strings (bytes, lists),
    so CSV text and numeric columns skip the look at every cell."""
    if values.dtype != object or pd.api.types.infer_dtype(values, skipna=True) == "string":
        return pd.Series(False, index=values.index)
    return values.map(test).astype(bool)


def _is_binary(value: Any) -> bool:
    # Parquet BINARY holding UTF-8 (some writers store strings so) is text, as before
    if not isinstance(value, bytes):
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _drop_binary_extras(items: pd.DataFrame, path: Path, notes: dict[str, int]) -> pd.DataFrame:
    """Binary columns beyond the documented ones (images, say) hold no text to keep."""
    extras = [c for c in items.columns if c not in ("item_id", *ITEM_TEXT_FIELDS)]
    binary = [c for c in extras if _cells(items[c], _is_binary).any()]
    notes["binary_item_columns_dropped"] = len(binary)
    if binary:
        log.warning("%s: dropping binary (non-text) column(s) %s", path, binary)
    return items.drop(columns=binary)


def _reject_binary(frame: pd.DataFrame, columns: list[str], path: Path) -> None:
    for col in columns:
        bad = _cells(frame[col], _is_binary)
        problem = "value(s) are binary data, not UTF-8 text; this column must hold text or numbers"
        refuse_rows(
            frame[col], bad, path, col, problem, shown=lambda v: v[:16]
        )  # an image would flood it


def _ids(frame: pd.DataFrame, column: str, path: Path) -> pd.Series:
    lists = _cells(frame[column], _is_list)
    problem = "id(s) are lists; each row must hold one id (one row per user-item pair, or per item)"
    refuse_rows(frame[column], lists, path, column, problem, shown=list)
    return normalize_ids(frame[column])


def _is_list(value: Any) -> bool:
    return isinstance(value, LIST_TYPES)


def _text(values: pd.Series) -> pd.Series:
    """Text from CSV strings or Parquet values; a list (Parquet list column, e.g. categories) joins
    its items with ", " rather than becoming numpy's printed form."""
    if _cells(values, _is_list).any():
        values = values.map(_joined)
    return values.astype("string")


def _joined(value: Any) -> Any:
    if _is_list(value):
        return ", ".join(str(v) for v in value if v is not None)
    return value
