"""Readers that turn each supported source into the normalized interactions + items tables."""

from __future__ import annotations

from pathlib import Path

from sidrec.config import IngestConfig
from sidrec.sources.common import SourceTables


def read_source(cfg: IngestConfig) -> SourceTables:
    """Dispatch on ``ingest.source``. Raises :class:`~sidrec.errors.InputError` on unreadable input."""
    if cfg.source in ("movielens-100k", "movielens-1m"):
        from sidrec.sources.movielens import read_movielens

        return read_movielens(cfg.source, min_rating=cfg.min_rating)
    if cfg.source == "amazon-beauty":
        from sidrec.sources.amazon_beauty import read_amazon_beauty

        return read_amazon_beauty(cfg.amazon_beauty_folder(), min_rating=cfg.min_rating)
    if cfg.source == "csv":
        from sidrec.sources.tabular import read_tabular

        assert cfg.interactions is not None and cfg.items is not None  # checked by IngestConfig
        return read_tabular(cfg.interactions, cfg.items, min_rating=cfg.min_rating)
    if cfg.source == "amazon":
        from sidrec.sources.amazon import read_amazon

        return read_amazon(cfg.amazon, min_rating=cfg.min_rating)
    from sidrec.sources.minionerec import read_minionerec

    assert cfg.path is not None
    return read_minionerec(cfg.path, cfg.category)


def source_files(cfg: IngestConfig) -> list[Path]:
    """The files a source reads, without reading them (for cache keys and provenance)."""
    if cfg.source in ("movielens-100k", "movielens-1m"):
        from sidrec.sources.movielens import movielens_files

        return movielens_files(cfg.source)
    if cfg.source == "amazon-beauty":
        from sidrec.sources.amazon_beauty import amazon_beauty_files

        return amazon_beauty_files(cfg.amazon_beauty_folder())
    if cfg.source == "csv":
        return [p for p in (cfg.interactions, cfg.items) if p is not None]
    if cfg.source == "amazon":
        return [p for p in (cfg.amazon.reviews, cfg.amazon.meta) if p is not None]
    assert cfg.path is not None
    return (
        sorted(p for p in cfg.path.rglob("*") if p.is_file()) if cfg.path.is_dir() else [cfg.path]
    )


__all__ = ["SourceTables", "read_source", "source_files"]
