"""Bring-your-own-data: interactions and items as CSV or Parquet files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sidrec.errors import InputError
from sidrec.sources.common import (
    ITEM_TEXT_FIELDS,
    SourceTables,
    finish,
    normalize_ids,
    parse_timestamps,
    read_frame,
    require_columns,
)

INTERACTION_COLUMNS = ("user_id", "item_id", "timestamp")
ITEM_COLUMNS = ("item_id", "title")


def read_tabular(
    interactions_path: Path, items_path: Path, min_rating: float | None = None
) -> SourceTables:
    """Interactions (user_id, item_id, timestamp[, rating]) and items (item_id, title[, description,
    brand, categories, ...]). Extra item columns are kept as text fields."""
    inter = read_frame(interactions_path, "interactions")
    require_columns(inter, INTERACTION_COLUMNS, interactions_path, "interactions")
    items = read_frame(items_path, "items")
    require_columns(items, ITEM_COLUMNS, items_path, "items")

    interactions = pd.DataFrame(
        {
            "user_id": normalize_ids(inter["user_id"]),
            "item_id": normalize_ids(inter["item_id"]),
            "timestamp": parse_timestamps(inter["timestamp"], interactions_path, "timestamp"),
        }
    )
    if "rating" in inter.columns:
        rating = pd.to_numeric(inter["rating"], errors="coerce")
        bad = rating.isna() & inter["rating"].notna()
        if bad.any():
            raise InputError(
                f"{int(bad.sum())} rating(s) are not numbers",
                path=interactions_path,
                column="rating",
                rows=np.flatnonzero(bad.to_numpy())[:5].tolist(),
                values=inter["rating"][bad].head(5).tolist(),
            )
        interactions["rating"] = rating.astype(float)

    catalog = pd.DataFrame({"item_id": normalize_ids(items["item_id"])})
    catalog["title"] = items["title"].astype("string").str.strip()
    for col in items.columns:
        if col not in ("item_id", "title"):
            catalog[col] = items[col].astype("string")
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
        notes={},
    )
