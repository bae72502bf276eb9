"""Stage 4 — embed: item text → L2-normalized float32 ``item_emb.npy`` (row i = catalog row i)
plus a manifest. Texts already encoded by the same encoder are read from a content-hash cache."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task

from sidrec.config import BUNDLED_ENCODERS, EmbedConfig, Settings
from sidrec.errors import ConfigError, InputError
from sidrec.io import AtomicOutputs, atomic_path, read_table
from sidrec.orchestration import StageCache, publish_stats
from sidrec.progress import interactive
from sidrec.protocol import catalog_fingerprint, fingerprint
from sidrec.schemas import ITEMS
from sidrec.stage import StageResult
from tasks.shared.texts import render_texts

log = logging.getLogger(__name__)


def encoder_location(name: str) -> str:
    """The bundled offline copy for known names, else the name itself (a folder or hub id)."""
    if name in BUNDLED_ENCODERS:
        module = __import__(BUNDLED_ENCODERS[name])
        return str(module.get_model_path())
    return name


def encoder_files_sha256(cfg: EmbedConfig) -> str | None:
    """A content hash of the local folder ``embed.encoder`` names (None for the bundled
    encoder, pinned by its package, and hub ids): a model replaced in that folder is another
    encoder to the cache, the manifest and the SID map's record."""
    folder = cfg.encoder_folder()
    return fingerprint([folder]) if folder is not None else None


def load_encoder(cfg: EmbedConfig) -> Any:
    location = encoder_location(cfg.encoder)
    if Path(location).exists():
        os.environ.setdefault(
            "HF_HUB_OFFLINE", "1"
        )  # never reach for a hub when the files are here
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(location, device=cfg.device)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"embed.encoder {cfg.encoder!r} cannot be loaded from {location!r}: {exc}"
        ) from None


class EmbeddingCache:
    """``<cache_dir>/<encoder hash>.npz``: text hash → vector, for one encoder (its name, and
    for a local folder the hash of its files)."""

    def __init__(self, cache_dir: Path, encoder: str, files_sha256: str | None = None):
        identity = encoder if files_sha256 is None else f"{encoder}@{files_sha256}"
        self.path = cache_dir / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.npz"
        self.vectors: dict[str, np.ndarray] = {}
        if self.path.exists():
            try:
                with np.load(self.path) as data:
                    self.vectors = dict(zip(data["keys"].tolist(), data["vectors"], strict=True))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("ignoring unreadable embedding cache %s (%s)", self.path, exc)

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    def save(self) -> None:
        keys = np.array(list(self.vectors), dtype="U64")
        vectors = (
            np.stack(list(self.vectors.values())) if self.vectors else np.zeros((0, 0), np.float32)
        )
        with atomic_path(self.path) as tmp, tmp.open("wb") as fh:
            np.savez(fh, keys=keys, vectors=vectors)


def encode_items(
    texts: list[str], cfg: EmbedConfig, files_sha256: str | None = None
) -> tuple[np.ndarray, int]:
    """Embeddings for ``texts`` (L2-normalized float32) by the encoder ``cfg`` names, whose
    folder's files hash to ``files_sha256`` (``encoder_files_sha256``); returns (matrix, number
    encoded now)."""
    cache = EmbeddingCache(cfg.cache_dir, cfg.encoder, files_sha256)
    keys = [cache.key(t) for t in texts]
    missing = sorted(
        {k: t for k, t in zip(keys, texts, strict=True) if k not in cache.vectors}.items()
    )
    if missing:
        model = load_encoder(cfg)
        # off a terminal this start line and embed()'s end line stand in for the bar
        log.info("encoding %d texts with %s", len(missing), cfg.encoder)
        fresh = model.encode(
            [t for _, t in missing],
            batch_size=cfg.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=interactive(),
        )
        cache.vectors.update(
            {k: v.astype(np.float32) for (k, _), v in zip(missing, fresh, strict=True)}
        )
        cache.save()
    emb = np.stack([cache.vectors[k] for k in keys]).astype(np.float32)
    emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return emb, len(missing)


def embed(settings: Settings) -> StageResult:
    cfg = settings.embed
    paths = settings.paths
    items = read_table(paths.validated("items"), ITEMS, "validated items")
    texts = render_texts(items, cfg.template, "embed.template")
    started = time.perf_counter()
    files_sha256 = encoder_files_sha256(cfg)
    emb, encoded = encode_items(texts, cfg, files_sha256)
    seconds = time.perf_counter() - started
    bad = ~np.isfinite(emb).all(axis=1)
    if bad.any():
        raise InputError(
            f"encoder produced NaN/inf embeddings for {int(bad.sum())} item(s)",
            path=paths.item_emb,
            values=items["item_id"][bad].head(5).tolist(),
        )
    manifest = {
        "dataset": settings.project.dataset,
        "encoder": cfg.encoder,
        "encoder_files_sha256": files_sha256,
        "dim": int(emb.shape[1]),
        "template": cfg.template,
        "items": len(items),
        "item_ids_sha256": catalog_fingerprint(items["item_id"].tolist()),
        "normalized": True,
        "encoded": encoded,
        "from_cache": len(items) - encoded,
        "seconds": round(seconds, 2),
    }
    outputs = [paths.item_emb, paths.item_emb_manifest, paths.metrics("embed")]
    with AtomicOutputs() as out:
        out.stage(paths.item_emb, lambda tmp: _save_npy(tmp, emb))
        out.json(manifest, paths.item_emb_manifest)
        out.json(manifest, paths.metrics("embed"))
    log.info(
        "embedded %d items (%d encoded, %d from cache) in %.1fs",
        len(items),
        encoded,
        len(items) - encoded,
        seconds,
    )
    summary = (
        f"{manifest['items']:,} items · dim {manifest['dim']} · "
        f"{manifest['encoded']:,} encoded, {manifest['from_cache']:,} cached"
    )
    return StageResult.from_files("embed", outputs, manifest, summary)


def _save_npy(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as fh:
        np.save(fh, array)


@task(name="embed", cache_policy=StageCache(stage="embed"), persist_result=True)
def embed_task(settings: Settings) -> StageResult:
    result = embed(settings)
    m = result.metrics
    publish_stats(
        "embeddings",
        m["dataset"],
        {k: m[k] for k in ("encoder", "dim", "items", "encoded", "from_cache", "seconds")},
        description="Item text embeddings",
    )
    return result
