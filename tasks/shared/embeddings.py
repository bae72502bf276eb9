"""What the sids stage quantizes, one row per catalog item (``sids.embedding``): the embed
stage's text embeddings, collaborative item factors of the train split, or both side by side
(``hybrid``). The semantic GRPO reward reads the same checked text embeddings."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from models.item_factors import CollaborativeBasis, ItemFactors, fit_item_factors, fold_in
from models.sid import SidMap, read_retired_sids, read_sid_map
from sidrec.config import Settings
from sidrec.errors import ConfigError, InputError
from sidrec.io import read_json
from sidrec.protocol import catalog_fingerprint
from tasks.shared.inputs import read_split

if TYPE_CHECKING:  # the quantizers (and faiss) load only where SIDs are built
    from models.quantizer import SavedQuantizer


def load_embeddings(settings: Settings, item_ids: list[str]) -> np.ndarray:
    """``item_emb.npy``, checked against the catalog: same rows, same order, finite values."""
    paths = settings.paths
    if not paths.item_emb.exists():
        raise InputError("item embeddings not found; run `sidrec embed` first", path=paths.item_emb)
    try:
        emb = np.load(paths.item_emb, allow_pickle=False)
        manifest = json.loads(paths.item_emb_manifest.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"embeddings or their manifest are unreadable ({exc})", path=paths.item_emb
        ) from None
    if emb.ndim != 2 or len(emb) != len(item_ids):
        raise InputError(
            f"embeddings have shape {emb.shape}, expected {len(item_ids)} rows (one per catalog item); re-run `sidrec embed`",
            path=paths.item_emb,
        )
    if manifest.get("item_ids_sha256") != catalog_fingerprint(item_ids):
        raise InputError(
            "embeddings were computed for another catalog order; re-run `sidrec embed`",
            path=paths.item_emb,
        )
    bad = ~np.isfinite(emb).all(axis=1)
    if bad.any():
        raise InputError(
            f"{int(bad.sum())} embedding row(s) contain NaN or inf",
            path=paths.item_emb,
            rows=np.flatnonzero(bad)[:5].tolist(),
            values=[item_ids[row] for row in np.flatnonzero(bad)[:5]],
        )
    return emb.astype(np.float32, copy=False)


class ItemEmbeddings(NamedTuple):
    """What the quantizer codes: one row per catalog item, and how the rows were made."""

    matrix: np.ndarray
    """(items, dim) float32, rows aligned with the catalog."""
    record: dict[str, Any]
    """Saved with the quantizer (incremental runs must embed new items the same way): the
    source, ``dim``, the collaborative keys and the basis new items are folded into."""
    without_interactions: int | None
    """Catalog items without train interactions (None for ``text``: the split is not read)."""


def embedding_recipe(settings: Settings) -> dict[str, Any]:
    """What decides how items are embedded (compared in incremental mode): the sids keys, and
    for text embeddings the encoder and template the embed stage used (its manifest)."""
    cfg = settings.sids
    recipe: dict[str, Any] = {"source": cfg.embedding}
    if cfg.embedding != "text":
        recipe["collaborative_dim"] = cfg.collaborative_dim
    if cfg.embedding == "hybrid":
        recipe["collaborative_weight"] = cfg.collaborative_weight
    if cfg.embedding in ("text", "hybrid"):
        manifest = read_json(
            settings.paths.item_emb_manifest,
            "the item embeddings' manifest",
            "run `sidrec embed` first",
        )
        recipe["text"] = {key: manifest.get(key) for key in ("encoder", "template")}
        if manifest.get("encoder_files_sha256") is not None:  # a local folder's encoder
            recipe["text"]["encoder_files_sha256"] = manifest["encoder_files_sha256"]
    return recipe


def item_embeddings(
    settings: Settings, items: pd.DataFrame, previous: SavedQuantizer | None = None
) -> ItemEmbeddings:
    """The matrix ``sids.embedding`` asks for. Extending a map (``previous``), it must be the
    map's kind: same recipe, same width, collaborative factors in the saved basis."""
    cfg, path = settings.sids, settings.paths.quantizer
    recipe = embedding_recipe(settings)
    if previous is not None:
        # keys a quantizer saved by an older version lacks are not compared
        built = {k: previous.embedding[k] for k in recipe if k in previous.embedding}
        built.setdefault("source", "text")  # quantizers saved before sids.embedding existed
        asked = {k: recipe[k] for k in built}
        if isinstance(built.get("text"), dict) and isinstance(asked.get("text"), dict):
            asked["text"] = {k: asked["text"].get(k) for k in built["text"]}  # the same rule
        if built != asked:
            raise InputError(
                f"the SID map was built from {built} embeddings, this run asks for {asked}; "
                "new items must be embedded as the map's items were: set those sids (or embed) "
                "keys back, or rebuild the map (sids.incremental=false)",
                path=path,
            )
    if cfg.embedding == "text":
        matrix, without = load_embeddings(settings, items["item_id"].tolist()), None
    else:
        basis = previous.embedding.get("basis") if previous is not None else None
        factors = collaborative_factors(
            settings, items, CollaborativeBasis.from_state(basis) if basis else None
        )
        cold = items["item_id"][factors.without_interactions].tolist()
        # extending a map, only the items it codes now need factors: the others keep their SIDs
        coded = items["item_id"][
            factors.without_interactions & ~_in_map(settings, items, previous is not None)
        ]
        if len(coded) and cfg.embedding == "collaborative":
            raise InputError(
                f"{len(coded)} catalog item(s) have no interactions in the train split"
                f"{' by users the saved quantizer knows' if basis else ''}, so collaborative "
                "factors cannot place them; use sids.embedding=hybrid (such items are coded "
                "from their text)",
                path=settings.paths.split("train"),
                values=coded.tolist(),
            )
        matrix, without = factors.factors, len(cold)
        if cfg.embedding == "hybrid":
            text = load_embeddings(settings, items["item_id"].tolist())
            norms = np.linalg.norm(text, axis=1, keepdims=True)
            text = np.divide(text, norms, out=np.zeros_like(text), where=norms > 0)
            matrix = np.hstack([text, cfg.collaborative_weight * matrix]).astype(np.float32)
        recipe["basis"] = factors.basis.state()
    recipe["dim"] = int(matrix.shape[1])
    if previous is not None and previous.embedding.get("dim", recipe["dim"]) != recipe["dim"]:
        raise InputError(
            f"the saved quantizer codes {previous.embedding['dim']}-dimensional embeddings, "
            f"today's are {recipe['dim']}-dimensional (another text encoder?); rebuild the map "
            "(sids.incremental=false)",
            path=path,
        )
    return ItemEmbeddings(matrix, recipe, without)


def interaction_pairs(
    train: pd.DataFrame, rows_per_chunk: int = 20_000
) -> tuple[list[str], list[str]]:
    """Every distinct (user, item) of the train rows' targets and history items.

    A user's items recur in the histories of all their later rows (up to split.max_history
    times); the factors read a binary matrix, so the repeats are dropped chunk by chunk
    instead of being exploded all at once (50x the interactions at max_history 50)."""
    parts = []
    for lo in range(0, len(train), rows_per_chunk):
        rows = train.iloc[lo : lo + rows_per_chunk]
        history = rows[["user_id", "history"]].explode("history").dropna(subset=["history"])
        pairs = pd.DataFrame(
            {
                "user": pd.concat([rows["user_id"], history["user_id"]], ignore_index=True),
                "item": pd.concat([rows["target"], history["history"]], ignore_index=True),
            }
        )
        parts.append(pairs.astype(str).drop_duplicates())
    if not parts:
        return [], []
    pairs = pd.concat(parts, ignore_index=True).drop_duplicates()
    return pairs["user"].tolist(), pairs["item"].tolist()


def kept_sids(settings: Settings) -> SidMap:
    """The SIDs an incremental run keeps: the map's, and those of items that left the catalog
    since its full build (``retired.json``: free for no other item; a returning item takes its
    own back)."""
    paths = settings.paths
    in_map, retired = read_sid_map(paths.sid_map), read_retired_sids(paths.retired_sids)
    widths = {len(sid) for sid in (*in_map.values(), *retired.values())}
    if len(widths) > 1:
        raise InputError(
            f"the retired SIDs are not as long as the map's ({sorted(widths)} codes); rebuild "
            "the map (sids.incremental=false)",
            path=paths.retired_sids,
        )
    k = settings.sids.codebook_size
    beyond = [item for item, sid in retired.items() if max(sid) >= k]
    if beyond:
        raise InputError(
            f"retired SIDs hold codes beyond sids.codebook_size={k}; rebuild the map "
            "(sids.incremental=false)",
            path=paths.retired_sids,
            values=beyond[:5],
        )
    return {**retired, **in_map}


def _in_map(settings: Settings, items: pd.DataFrame, extending: bool) -> np.ndarray:
    """Which catalog items the map being extended already codes (none for a full build)."""
    if not extending:
        return np.zeros(len(items), dtype=bool)
    return items["item_id"].isin(list(kept_sids(settings))).to_numpy()


def collaborative_factors(
    settings: Settings, items: pd.DataFrame, basis: CollaborativeBasis | None
) -> ItemFactors:
    """Item factors from the train split only (valid and test targets never leak in): a new
    truncated SVD, or a fold-in into the basis of the map being extended."""
    cfg, path = settings.sids, settings.paths.split("train")
    users, consumed = interaction_pairs(read_split(settings, "train"))
    catalog = items["item_id"].tolist()
    unknown = sorted(set(consumed) - set(catalog))
    if unknown:
        raise InputError(
            f"{len(unknown)} item(s) of the train split are not in the catalog; "
            "re-run `sidrec split`",
            path=path,
            values=unknown,
        )
    if basis is not None:
        return fold_in(users, consumed, item_ids=catalog, basis=basis)
    n_users = len(set(users))
    if cfg.collaborative_dim >= min(n_users, len(catalog)):
        raise ConfigError(
            f"sids.collaborative_dim={cfg.collaborative_dim} must be smaller than the train "
            f"split's {n_users} users and the catalog's {len(catalog)} items; lower "
            "sids.collaborative_dim"
        )
    return fit_item_factors(
        users, consumed, item_ids=catalog, dim=cfg.collaborative_dim, seed=settings.project.seed
    )
