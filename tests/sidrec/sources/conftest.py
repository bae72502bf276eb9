"""Fixtures of the source reader tests: Amazon reviews files (``amazon``)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sidrec.sources.common import SourceTables


class AmazonFiles:
    """Amazon reviews and metadata records (2018 and 2023 formats), their JSON lines files and
    the reader's tables."""

    @staticmethod
    def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
        """JSON lines, gzip-compressed when the name ends in ``.gz``."""
        text = "".join(json.dumps(r) + "\n" for r in records)
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(text.encode("utf-8")))
        else:
            path.write_text(text, encoding="utf-8")
        return path

    @staticmethod
    def review18(user: str, item: str, t: int, rating: float = 5.0) -> dict[str, Any]:
        stamp = dt.datetime.fromtimestamp(t, dt.UTC)
        return {
            "reviewerID": user,
            "asin": item,
            "overall": rating,
            "unixReviewTime": t,
            "reviewTime": f"{stamp:%m %d, %Y}",
            "reviewerName": f"Name of {user}",
            "reviewText": "Works as described.",
            "summary": "Fine",
            "verified": True,
        }

    @staticmethod
    def meta18(item: str, title: Any, **extra: Any) -> dict[str, Any]:
        record = {
            "asin": item,
            "title": title,
            "description": [f"About {item}."],
            "brand": "Acme",
            "category": ["Industrial & Scientific", "Tapes"],
            "price": "$9.99",
            "also_buy": [],
            "feature": ["Strong"],
        }
        record.update(extra)
        return record

    @staticmethod
    def review23(user: str, item: str, t_ms: int, rating: float = 5.0) -> dict[str, Any]:
        return {
            "user_id": user,
            "parent_asin": item,
            "asin": item + "-variant",
            "rating": rating,
            "timestamp": t_ms,
            "title": "Great",
            "text": "Works as described.",
            "images": [],
            "helpful_vote": 2,
            "verified_purchase": True,
        }

    @staticmethod
    def meta23(item: str, title: Any, **extra: Any) -> dict[str, Any]:
        record = {
            "parent_asin": item,
            "main_category": "Industrial & Scientific",
            "title": title,
            "average_rating": 4.5,
            "rating_number": 10,
            "features": ["Strong", "Cheap"],
            "description": [f"About {item}."],
            "price": 9.99,
            "store": "Acme",
            "categories": ["Industrial & Scientific", "Tapes"],
            "details": {"Color": "Black"},
        }
        record.update(extra)
        return record

    def read(
        self, folder: Path, reviews: list, meta: list, *, gz: bool = False, **cfg: Any
    ) -> SourceTables:
        """The reader's tables of ``reviews.jsonl[.gz]`` and ``meta.jsonl[.gz]`` in ``folder``
        (k-core 1 unless given)."""
        from sidrec.config import AmazonConfig
        from sidrec.sources.amazon import read_amazon

        suffix = ".jsonl.gz" if gz else ".jsonl"
        rpath = self.write_jsonl(folder / f"reviews{suffix}", reviews)
        mpath = self.write_jsonl(folder / f"meta{suffix}", meta)
        cfg.setdefault("k_core", 1)
        return read_amazon(AmazonConfig(reviews=rpath, meta=mpath, **cfg))

    @staticmethod
    def triples(tables: SourceTables) -> list[tuple[str, str, int]]:
        inter = tables.interactions
        return list(
            zip(inter["user_id"], inter["item_id"], inter["timestamp"].astype(int), strict=True)
        )

    @staticmethod
    def item_row(tables: SourceTables, item: str) -> dict[str, Any]:
        return tables.items.set_index("item_id").loc[item].to_dict()


@pytest.fixture(scope="session")
def amazon() -> AmazonFiles:
    """Amazon reviews files: ``review18``/``meta18``/``review23``/``meta23`` records,
    ``write_jsonl``, ``read(folder, reviews, meta, gz=False, **cfg)``, ``triples`` and
    ``item_row`` of the tables read."""
    return AmazonFiles()
