"""Stage 5 — sids: item embeddings → collision-free semantic IDs.

What is quantized (``sids.embedding``): the text embeddings of the embed stage, collaborative
item factors of the train split, or both side by side (``hybrid``).
Writes ``data/sids/<ds>/sid_map.json`` (item_id → codes, equal length, unique), the trained
quantizer beside it, a code-usage plot and ``metrics/sids.json``.
Modes: full build (default), ``incremental`` (existing SIDs kept, new items coded by the saved
quantizer) and ``import_index`` (a MiniOneRec ``.index.json``).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from prefect import task

from models.collisions import CatalogTooLarge, CostFn, Resolution, resolve_collisions
from models.quantizer import Quantizer, SavedQuantizer, load_quantizer, save_quantizer
from models.sid import SidMap, collision_stats, read_minionerec_index
from sidrec.config import Settings, SidsConfig
from sidrec.errors import ConfigError, InputError
from sidrec.io import AtomicOutputs, read_table
from sidrec.orchestration import StageCache, publish_table
from sidrec.schemas import ITEMS
from sidrec.stage import StageResult
from sidrec.tracking import log_stage
from tasks.shared.embeddings import item_embeddings, kept_sids

log = logging.getLogger(__name__)


def check_capacity(n_items: int, cfg: SidsConfig) -> None:
    """A config error before any training when levels × K cannot give every item its own SID."""
    if n_items > cfg.codebook_size**cfg.levels:
        raise ConfigError(
            f"sids: {n_items} items cannot get distinct SIDs from {cfg.levels} levels x {cfg.codebook_size} codes "
            f"({cfg.codebook_size**cfg.levels} SIDs); raise sids.codebook_size or sids.levels"
        )
    if n_items < cfg.codebook_size:
        raise ConfigError(
            f"sids: the catalog has {n_items} items, fewer than sids.codebook_size={cfg.codebook_size}; "
            "k-means cannot fill the codebook — lower sids.codebook_size"
        )


def train_quantizer(emb: np.ndarray, settings: Settings) -> tuple[Quantizer, np.ndarray]:
    cfg = settings.sids
    if cfg.method == "rqkmeans":
        from models.rqkmeans import RQKMeans

        rqk = RQKMeans(
            levels=cfg.levels,
            codebook_size=cfg.codebook_size,
            niter=cfg.rqkmeans.niter,
            balanced=cfg.rqkmeans.balanced,
            seed=settings.project.seed,
        )
        return rqk, rqk.fit(emb)
    from models.quantizer import RQVAEQuantizer
    from models.rqvae import RQVAEConfig, train_rqvae

    # the params.yaml section has exactly RQVAEConfig's training fields
    config = RQVAEConfig(
        **cfg.rqvae.model_dump(),
        levels=cfg.levels,
        codebook_size=cfg.codebook_size,
        seed=settings.project.seed,
    )
    quantizer = RQVAEQuantizer(train_rqvae(emb, config).model)
    return quantizer, quantizer.encode(emb)


def level_usage(codes: np.ndarray, k: int) -> list[dict[str, float]]:
    """Per level: share of the K codes in use and the perplexity of the code distribution."""
    out = []
    for level in range(codes.shape[1]):
        counts = np.bincount(codes[:, level], minlength=k).astype(float)
        p = counts[counts > 0] / counts.sum()
        out.append(
            {
                "level": level,
                "used": int((counts > 0).sum()),
                "usage": round(float((counts > 0).sum() / max(k, len(counts))), 4),
                "perplexity": round(float(np.exp(-(p * np.log(p)).sum())), 2),
            }
        )
    return out


class Codes(NamedTuple):
    """Every catalog item's codes before collision resolution, and how they were made."""

    raw: np.ndarray
    """(items, levels) codes, rows aligned with the catalog."""
    quantizer: Quantizer | None
    """The quantizer that encoded them (None for an imported index)."""
    trained: bool
    """A new quantizer was trained in this run: it is saved with the map."""
    method: str
    mode: str
    """How the map was built, for the report: ``full``, ``incremental`` or ``import``."""
    codebook_size: int
    facts: dict[str, Any]
    """Report fields of this way of building (``train_seconds``, ``new_items``)."""
    fixed: np.ndarray | None = None
    """Rows whose SID must not change (items of the previous map); they also forbid an extra level."""
    retired: SidMap | None = None
    """SIDs of items no longer in the catalog that no item may take (incremental runs)."""


def previous_quantizer(settings: Settings) -> SavedQuantizer | None:
    """The saved quantizer of the map an incremental run extends (None: no map to extend)."""
    cfg = settings.sids
    if cfg.import_index is not None or not cfg.incremental or not settings.paths.sid_map.exists():
        return None
    previous = load_quantizer(settings.paths.quantizer)
    q = previous.quantizer
    saved = {"method": q.state()["method"], "levels": q.levels, "codebook_size": q.codebook_size}
    asked = {"method": cfg.method, "levels": cfg.levels, "codebook_size": cfg.codebook_size}
    if saved != asked:  # new items are coded by the saved quantizer, whatever these keys say
        raise InputError(
            f"the SID map's quantizer is {saved}, this run asks for {asked}; new items are coded "
            "by the map's quantizer: set those sids keys back, or rebuild the map "
            "(sids.incremental=false)",
            path=settings.paths.quantizer,
        )
    return previous


def build(
    settings: Settings,
    items: pd.DataFrame,
    emb: np.ndarray,
    previous: SavedQuantizer | None = None,
) -> Codes:
    """Codes for every catalog item: from an imported index, by extending the previous map
    (``previous``: its saved quantizer), or from a newly trained quantizer."""
    cfg = settings.sids
    ids = items["item_id"].tolist()
    if cfg.import_index is not None:
        return imported_codes(cfg, ids)
    if previous is not None:
        return incremental_codes(settings, ids, emb, previous.quantizer)
    if cfg.incremental:
        log.info("sids.incremental: no SID map yet at %s, building one", settings.paths.sid_map)
    check_capacity(len(ids), cfg)
    started = time.perf_counter()
    quantizer, raw = train_quantizer(emb, settings)
    seconds = round(time.perf_counter() - started, 2)
    return Codes(
        raw,
        quantizer,
        True,
        cfg.method,
        "full",
        cfg.codebook_size,
        facts={"train_seconds": seconds},
    )


def imported_codes(cfg: SidsConfig, ids: list[str]) -> Codes:
    """The codes of a MiniOneRec ``.index.json`` (``sids.import_index``)."""
    assert cfg.import_index is not None
    imported = read_minionerec_index(cfg.import_index)
    missing = [i for i in ids if i not in imported]
    if missing:
        raise InputError(
            f"{len(missing)} catalog item(s) have no SID in the index",
            path=cfg.import_index,
            values=missing[:5],
        )
    raw = np.array([imported[i] for i in ids], dtype=np.int64)
    if collision_stats(raw).collision_rate > 0 and not cfg.resolve_imported_collisions:
        from models.sid import check_sid_map

        check_sid_map({i: imported[i] for i in ids}, cfg.import_index)  # raises, naming clashes
    k = max(cfg.codebook_size, int(raw.max()) + 1)
    return Codes(raw, None, False, "import", "import", k, facts={})


def incremental_codes(
    settings: Settings, ids: list[str], emb: np.ndarray, quantizer: Quantizer
) -> Codes:
    """Items of the previous map keep their SIDs, items that left it and come back take theirs
    back; new items are coded by the saved quantizer. The SIDs of items that left the catalog
    stay retired: a model warm-started from the champion learned them for those items.

    Where the map has a disambiguation level, the known items' indices on it come as the last
    column (new items: 0 until ``resolve`` gives them theirs)."""
    kept = kept_sids(settings)
    known = np.array([i in kept for i in ids])
    width = len(next(iter(kept.values())))
    raw = np.zeros((len(ids), width), dtype=np.int64)
    raw[:, : quantizer.levels] = quantizer.encode(emb)
    for row in np.flatnonzero(known):
        raw[row] = kept[ids[row]]
    catalog = set(ids)
    retired = {item: sid for item, sid in kept.items() if item not in catalog}
    cfg = settings.sids
    facts = {"new_items": int((~known).sum()), "retired_items": len(retired)}
    return Codes(
        raw, quantizer, False, cfg.method, "incremental", cfg.codebook_size, facts, known, retired
    )


def resolve(codes: Codes, emb: np.ndarray) -> Resolution:
    """Unique SIDs: colliding items move to free last-level codes (cheapest by the quantizer's
    distances), or get an extra level when that cannot suffice and no SID is fixed. On a map
    with an extra level already, new items take free indices on it (``resolve_collisions``)."""
    quantizer, raw, fixed = codes.quantizer, codes.raw, codes.fixed
    if codes.retired:  # retired SIDs take part as fixed rows, dropped from the result
        assert fixed is not None
        raw = np.vstack([raw, np.array(list(codes.retired.values()), dtype=np.int64)])
        fixed = np.r_[fixed, np.ones(len(codes.retired), dtype=bool)]
        # fixed rows never move: their distances are never used
        emb = np.vstack([emb, np.zeros((len(codes.retired), emb.shape[1]), dtype=emb.dtype)])
    held = None
    if fixed is not None and quantizer is not None and raw.shape[1] > quantizer.levels:
        raw, held = raw[:, : quantizer.levels], raw[:, -1]
    costs: CostFn | None = None
    if quantizer is not None:  # an item's distances to every code of its SID's last level
        costs = partial(_last_level_distances, quantizer, emb, raw)
    try:
        resolution = resolve_collisions(
            raw,
            codebook_size=codes.codebook_size,
            last_level_costs=costs,
            fixed=fixed,
            held=held,
            allow_extra_level=fixed is None or held is not None,
        )
    except CatalogTooLarge as exc:
        hint = "; run a full rebuild (sids.incremental=false)" if fixed is not None else ""
        raise ConfigError(f"sids: {exc}{hint}") from None
    return resolution._replace(codes=resolution.codes[: len(codes.raw)])


def _last_level_distances(
    quantizer: Quantizer, emb: np.ndarray, raw: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    return quantizer.last_level_distances(emb[rows], raw[rows, : quantizer.levels])


def sids(settings: Settings) -> StageResult:
    paths = settings.paths
    items = read_table(paths.validated("items"), ITEMS, "validated items")
    previous = previous_quantizer(settings)
    # an imported index brings its codes: nothing to embed, no quantizer's distances to resolve by
    imported = settings.sids.import_index is not None
    embedded = None if imported else item_embeddings(settings, items, previous)
    emb = embedded.matrix if embedded is not None else np.empty((len(items), 0), dtype=np.float32)
    codes = build(settings, items, emb, previous)
    resolution = resolve(codes, emb)
    final = resolution.codes
    before, after = collision_stats(codes.raw), collision_stats(final)
    assert after.collision_rate == 0.0, "collision resolution must leave every SID unique"
    sid_map = dict(zip(items["item_id"], final.tolist(), strict=True))
    quantizer = codes.quantizer
    report: dict[str, Any] = {
        "dataset": settings.project.dataset,
        "method": codes.method,
        "mode": codes.mode,
        "embedding": settings.sids.embedding,
        "items": len(items),
        "items_without_interactions": embedded.without_interactions if embedded else None,
        "levels": int(final.shape[1]),
        "codebook_size": codes.codebook_size,
        "collision_rate_before": round(before.collision_rate, 6),
        "collision_rate_after": after.collision_rate,
        "largest_collision_group": before.largest_group,
        "reassigned_last_level": resolution.reassigned,
        "extra_level": resolution.extra_level,
        "level_usage": level_usage(final, codes.codebook_size),
        "reconstruction_error": round(
            quantizer.reconstruction_error(emb, codes.raw[:, : quantizer.levels]), 6
        )
        if quantizer
        else None,
        **codes.facts,
    }
    outputs = [paths.sid_map, paths.retired_sids, paths.code_usage_plot, paths.metrics("sids")]
    with AtomicOutputs() as out:
        out.json(sid_map, paths.sid_map)
        out.json(codes.retired or {}, paths.retired_sids)
        if codes.trained:
            assert quantizer is not None and embedded is not None
            out.stage(
                paths.quantizer,
                lambda tmp: save_quantizer(quantizer, tmp, embedding=embedded.record),
            )
            outputs.append(paths.quantizer)
        out.stage(paths.code_usage_plot, lambda tmp: plot_code_usage(final, report, tmp))
        out.json(report, paths.metrics("sids"))
    if quantizer is None:  # a quantizer from an earlier build does not match an imported map
        paths.quantizer.unlink(missing_ok=True)
    log.info(
        "SIDs for %d items: collision rate %.4f -> 0 (%d reassigned, extra level: %s)",
        len(items),
        before.collision_rate,
        resolution.reassigned,
        resolution.extra_level,
    )
    summary = (
        f"{len(items):,} SIDs x {report['levels']} levels · collisions "
        f"{report['collision_rate_before']:.4f} → {after.collision_rate:.4f} · level-1 usage "
        f"{report['level_usage'][0]['usage']:.0%}"
    )
    return StageResult.from_files("sids", outputs, report, summary)


def plot_code_usage(codes: np.ndarray, report: dict[str, Any], path: Path) -> None:
    """One bar chart per level: items per code, most used first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = codes.shape[1]
    fig, axes = plt.subplots(levels, 1, figsize=(8, 2.2 * levels), squeeze=False)
    for level, ax in enumerate(axes[:, 0]):
        counts = np.sort(np.bincount(codes[:, level]))[::-1]
        ax.bar(np.arange(len(counts)), counts, width=1.0)
        usage = report["level_usage"][level]
        ax.set_title(
            f"level {level}: {usage['used']} codes used, perplexity {usage['perplexity']}",
            fontsize=9,
        )
        ax.set_ylabel("items")
    axes[-1, 0].set_xlabel("codes (most used first)")
    fig.suptitle(
        f"{report['dataset']}: {report['items']} items, method {report['method']}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=80)
    plt.close(fig)


def report_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The numeric part of the SID report, flat, for MLflow."""
    flat = {
        k: float(report[k])
        for k in (
            "items",
            "levels",
            "collision_rate_before",
            "collision_rate_after",
            "largest_collision_group",
        )
    }
    flat |= {
        k: float(report[k])
        for k in ("reconstruction_error", "train_seconds", "items_without_interactions")
        if report.get(k) is not None
    }
    for u in report["level_usage"]:
        flat[f"level{u['level']}_usage"] = u["usage"]
        flat[f"level{u['level']}_perplexity"] = u["perplexity"]
    return flat


@task(name="sids", cache_policy=StageCache(stage="sids"), persist_result=True)
def sids_task(settings: Settings) -> StageResult:
    result = sids(settings)
    m = result.metrics
    paths = settings.paths
    log_stage(
        dataset=m["dataset"],
        stage="sids",
        params=settings.section("sids"),
        metrics=report_metrics(m),
        artifacts=[paths.metrics("sids"), paths.code_usage_plot],
    )
    publish_table(
        "sid-report",
        m["dataset"],
        [
            {
                "level": u["level"],
                "codes used": u["used"],
                "usage": u["usage"],
                "perplexity": u["perplexity"],
            }
            for u in m["level_usage"]
        ],
        description=(
            f"{m['method']} SIDs of {m['embedding']} embeddings for {m['items']} items: collision rate {m['collision_rate_before']} before, "
            f"{m['collision_rate_after']} after resolution; largest group {m['largest_collision_group']}"
        ),
    )
    return result
