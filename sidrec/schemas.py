"""Declared schemas of the files stages exchange (ARCHITECTURE.md, "Stages and their contracts")."""

from __future__ import annotations

import pyarrow as pa

INTERACTIONS = pa.schema(
    [
        pa.field("user_id", pa.string()),
        pa.field("item_id", pa.string()),
        pa.field("timestamp", pa.int64()),  # Unix seconds, UTC
    ]
)
"""``interactions.parquet``; an optional float ``rating`` column may follow."""

ITEMS = pa.schema([pa.field("item_id", pa.string()), pa.field("title", pa.string())])
"""``items.parquet``; further text fields (description, brand, categories, ...) follow as strings."""

HISTORY = pa.large_list(pa.dictionary(pa.int32(), pa.string()))
"""A split's ``history``: item ids, oldest first, capped at ``split.max_history``. Stored as
item-id codes into one dictionary of the ids (a Parquet dictionary page): four bytes per entry
where plain strings copied each id into every history it is in, past the 2 GiB of a ``list``'s
string offsets at MovieLens-1M × 200 (~10^8 entries); 64-bit list offsets for 10^7 samples ×
200. Read back, a row is still a sequence of item-id strings. Files written before (``list``
of strings) are read as well."""

SPLIT = pa.schema(
    [
        pa.field("user_id", pa.string()),
        pa.field("history", HISTORY),
        pa.field("target", pa.string()),
        pa.field("timestamp", pa.int64()),  # the target interaction's time
    ]
)
"""``train/valid/test.parquet``: one row per (user, history, target)."""

LOAD_PROFILE = pa.schema(
    [
        pa.field("load", pa.string()),  # "current" (the last accepted load) or "previous"
        pa.field("kind", pa.string()),  # "user" or "item"
        pa.field("id", pa.string()),
        pa.field("interactions", pa.int64()),  # 0 for catalog items nobody interacted with
    ]
)
"""``data/drift/<ds>/profiles.parquet``: what the drift report compares a new load with."""
