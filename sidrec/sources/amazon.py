"""Amazon reviews 2018 and 2023 (JSON lines, plain or gzip) with MiniOneRec's preprocessing:
title sanity filters, an optional time window and iterated k-core filtering.

2018: reviews carry ``reviewerID``, ``asin``, ``overall``, ``unixReviewTime`` (seconds);
metadata ``asin``, ``title``, ``description`` (list), ``brand``, ``category`` (list).
2023: reviews carry ``user_id``, ``parent_asin``, ``rating``, ``timestamp`` (milliseconds);
metadata ``parent_asin``, ``title``, ``description`` (list), ``store``, ``categories`` (list).
"""

from __future__ import annotations

import datetime as dt
import gzip
import html
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from sidrec.config import AmazonConfig
from sidrec.errors import InputError
from sidrec.progress import ProgressBar
from sidrec.sources.common import (
    SourceTables,
    finish,
    normalize_ids,
    parse_ratings,
    within_dates,
)

log = logging.getLogger(__name__)

# (user, item, rating, time, time unit divisor) per format version
REVIEW_FIELDS = {
    "2018": ("reviewerID", "asin", "overall", "unixReviewTime", 1),
    "2023": ("user_id", "parent_asin", "rating", "timestamp", 1000),
}
META_FIELDS = {
    "2018": {"item_id": "asin", "brand": "brand", "categories": "category"},
    "2023": {"item_id": "parent_asin", "brand": "store", "categories": "categories"},
}


def iter_json_lines(path: Path, what: str) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file (``.gz`` transparently); any broken line is an InputError."""
    if not path.exists():
        raise InputError(f"{what} file does not exist", path=path)
    if path.stat().st_size == 0:
        raise InputError(f"{what} file is empty (0 bytes)", path=path)
    opener = gzip.open if path.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(
                        f"{what} line {lineno} is not valid JSON ({exc.msg} at column {exc.colno}); "
                        "the file may be truncated or not JSON lines",
                        path=path,
                    ) from None
                if not isinstance(record, dict):
                    raise InputError(f"{what} line {lineno} is not a JSON object", path=path)
                yield record
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, OSError) as exc:
        raise InputError(
            f"{what} file cannot be read after line {lineno} ({exc})", path=path
        ) from None


def detect_version(record: dict[str, Any], path: Path) -> str:
    if "reviewerID" in record:
        return "2018"
    if "parent_asin" in record and "user_id" in record:
        return "2023"
    raise InputError(
        f"cannot tell the Amazon reviews format from the keys {sorted(record)[:8]}: expected "
        "'reviewerID'/'asin' (2018) or 'user_id'/'parent_asin' (2023)",
        path=path,
    )


def read_reviews(path: Path) -> tuple[pd.DataFrame, str]:
    rows: list[tuple[Any, Any, Any, Any]] = []
    version = ""
    fields: tuple[str, str, str, str, int] = REVIEW_FIELDS["2018"]
    for record in ProgressBar(
        iter_json_lines(path, "reviews"), desc="reviews", unit=" lines", leave=False
    ):
        if not version:
            version = detect_version(record, path)
            fields = REVIEW_FIELDS[version]
        user, item, rating, time, _ = fields
        rows.append((record.get(user), record.get(item), record.get(rating), record.get(time)))
    if not rows:
        raise InputError("reviews file has no records", path=path)
    df = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "time"])
    missing = df[["user_id", "item_id", "time"]].isna().any(axis=1)
    if missing.any():
        raise InputError(
            f"{int(missing.sum())} review(s) lack {fields[0]}, {fields[1]} or {fields[3]}",
            path=path,
            rows=missing[missing].index[:5].tolist(),
        )
    seconds = within_dates(pd.to_numeric(df["time"], errors="coerce") / fields[4])
    if seconds.isna().any():
        bad = seconds.isna()
        raise InputError(
            f"{int(bad.sum())} review time(s) are not numbers or not dates (expected Unix "
            f"{'seconds' if fields[4] == 1 else 'milliseconds'} between the years 1677 and 2262)",
            path=path,
            column=fields[3],
            rows=bad[bad].index[:5].tolist(),
            values=df["time"][bad].head(5).tolist(),
        )
    out = pd.DataFrame(
        {
            "user_id": normalize_ids(df["user_id"].astype(str)),
            "item_id": normalize_ids(df["item_id"].astype(str)),
            "timestamp": seconds.astype("int64").astype("Int64"),
            "rating": parse_ratings(df["rating"], path, fields[2]),
        }
    )
    blank = out["user_id"].isna() | out["item_id"].isna()
    if blank.any():
        raise InputError(
            f"{int(blank.sum())} review(s) have a blank {fields[0]} or {fields[1]}",
            path=path,
            rows=blank[blank].index[:5].tolist(),
        )
    return out, version


def clean_title(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    return re.sub(r"\s+", " ", html.unescape(value)).strip()


def _text(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(clean_title(v) for v in value if isinstance(v, str)).strip()
    return clean_title(value)


def read_meta(path: Path, version: str) -> pd.DataFrame:
    names = META_FIELDS[version]
    rows = []
    for record in ProgressBar(
        iter_json_lines(path, "metadata"), desc="metadata", unit=" lines", leave=False
    ):
        item = record.get(names["item_id"])
        if item is None:
            continue
        rows.append(
            {
                "item_id": str(item),
                "title": clean_title(record.get("title")),
                "description": _text(record.get("description")),
                "brand": _text(record.get(names["brand"])),
                "categories": ", ".join(
                    clean_title(c)
                    for c in record.get(names["categories"]) or []
                    if isinstance(c, str)
                ),
            }
        )
    if not rows:
        raise InputError(f"metadata file has no records with '{names['item_id']}'", path=path)
    return pd.DataFrame(rows).drop_duplicates("item_id", keep="first")


def k_core(df: pd.DataFrame, k: int) -> pd.DataFrame:
    """Repeat dropping users and items with fewer than ``k`` interactions until none is left."""
    while True:
        users = df["user_id"].map(df["user_id"].value_counts())
        items = df["item_id"].map(df["item_id"].value_counts())
        keep = ((users >= k) & (items >= k)).fillna(False)
        if keep.all():
            return df
        df = df[keep]


def read_amazon(cfg: AmazonConfig, min_rating: float | None = None) -> SourceTables:
    assert cfg.reviews is not None and cfg.meta is not None  # checked by AmazonConfig
    reviews, version = read_reviews(cfg.reviews)
    meta = read_meta(cfg.meta, version)
    notes: dict[str, int] = {"reviews_read": len(reviews)}

    words = meta["title"].str.split().str.len().fillna(0)
    good = (meta["title"] != "") & (words <= cfg.max_title_words)
    notes["items_bad_title"] = int((~good).sum())
    meta = meta[good]

    known = reviews["item_id"].isin(meta["item_id"])
    notes["reviews_without_metadata"] = int((~known).sum())
    reviews = reviews[known]
    if cfg.start or cfg.end:
        lo = _epoch(cfg.start) if cfg.start else -(2**62)
        hi = _epoch(cfg.end) if cfg.end else 2**62
        inside = (reviews["timestamp"] >= lo) & (reviews["timestamp"] < hi)
        notes["reviews_outside_window"] = int((~inside).sum())
        reviews = reviews[inside]
    before = len(reviews)
    reviews = reviews.drop_duplicates(["user_id", "item_id", "timestamp"])
    notes["duplicate_reviews"] = before - len(reviews)
    if min_rating is not None:
        keep = reviews["rating"] >= min_rating
        notes["interactions_below_min_rating"] = int((~keep).sum())
        reviews = reviews[keep]
    before = len(reviews)
    reviews = k_core(reviews, cfg.k_core)
    notes["reviews_removed_by_k_core"] = before - len(reviews)
    log.info("amazon %s: %s", version, notes)
    items = meta[meta["item_id"].isin(reviews["item_id"])]
    return finish(reviews, items, {"interactions": [cfg.reviews], "items": [cfg.meta]}, None, notes)


def _epoch(day: dt.date) -> int:
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp())
