"""Synthetic catalogs and interaction logs for ``bench.scale``, seeded and vectorized.

- :func:`interaction_log`: a power-law log (item popularity ~ rank^-0.9, Pareto-tailed user
  activity, every user >= 5 rows with strictly increasing times, the file in time order);
- :func:`catalog`: item ids ``i0`` … with titles naming the item's topic;
- :func:`clustered_embeddings`: unit-length vectors clustered by topic, as text embeddings of
  a catalog are.

The ``write_*`` functions leave them where the pipeline reads them: the CSV files of a
``csv`` source, or a validated items table with ``item_emb.npy`` and its manifest (what
validate and embed write).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sidrec.paths import DatasetPaths
from sidrec.protocol import catalog_fingerprint
from sidrec.schemas import ITEMS

EMBEDDING_DIM = 384
"""As all-MiniLM-L6-v2, the default encoder."""
LATENT_DIM, TOPIC_SPREAD, NOISE = 16, 0.5, 0.05
"""Topics live in a 16-dimensional subspace: with L=3, K=256, RQ-KMeans then gives ~10% of
10^5 items a SID another item has (isotropic 384-dimensional clusters: almost all)."""
ITEMS_PER_TOPIC = 100
ITEM_POPULARITY_EXPONENT = 0.9
"""The item of popularity rank r is drawn with probability ~ (r + 1) ** -0.9."""
USER_ACTIVITY_TAIL = 1.5
"""Pareto shape of each user's share of the rows beyond the minimum."""
MIN_USER_ROWS, MEAN_USER_ROWS = 5, 20
START, END = 1_325_376_000, 1_704_067_200
"""2012-01-01 and 2024-01-01 (Unix seconds): every timestamp lies between them."""


def prefixed(prefix: str, numbers: np.ndarray) -> pa.Array:
    """``prefix`` + decimal number, as an Arrow string array (ids like ``i123``)."""
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(numbers), pa.string()), "")


def interaction_log(
    n_rows: int, n_items: int, seed: int = 0, n_users: int | None = None
) -> pa.Table:
    """Exactly ``n_rows`` interactions (user_id, item_id, timestamp) of ``n_users`` users
    (default ``n_rows // 20``; MovieLens-1M has 6,040 users of 165 rows on average) over items
    ``i0`` … ``i<n_items - 1>``, in time order; (user, item, timestamp) is unique because each
    user's timestamps strictly increase."""
    rng = np.random.default_rng(seed)
    n_users = n_users or max(1, n_rows // MEAN_USER_ROWS)
    if n_rows < n_users * MIN_USER_ROWS:
        raise ValueError(f"{n_rows} rows cannot give {n_users} users {MIN_USER_ROWS} rows each")
    share = rng.pareto(USER_ACTIVITY_TAIL, n_users)
    extra = np.floor(share / share.sum() * (n_rows - n_users * MIN_USER_ROWS)).astype(np.int64)
    lengths = MIN_USER_ROWS + extra
    lengths[np.argmax(lengths)] += n_rows - lengths.sum()  # what the rounding left over
    user = np.repeat(np.arange(n_users), lengths)
    position = np.arange(n_rows) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    # a user's k-th row falls in the k-th of `lengths` equal slices (>= 1 s each) of its span
    span = rng.integers(30 * 86_400, 3 * 365 * 86_400, n_users)
    slot = span / lengths
    start = rng.integers(START, END - span)
    offset = np.floor((position + rng.random(n_rows)) * slot[user]).astype(np.int64)
    timestamp = start[user] + offset
    weights = np.cumsum((np.arange(n_items) + 1.0) ** -ITEM_POPULARITY_EXPONENT)
    rank = np.minimum(np.searchsorted(weights / weights[-1], rng.random(n_rows)), n_items - 1)
    item = rng.permutation(n_items)[rank]  # the most popular items are not the lowest ids
    order = np.argsort(timestamp, kind="stable")
    return pa.table(
        {
            "user_id": prefixed("u", user[order]),
            "item_id": prefixed("i", item[order]),
            "timestamp": pa.array(timestamp[order]),
        }
    )


def topics(n_items: int) -> int:
    """Topics of a synthetic catalog: one per ``ITEMS_PER_TOPIC`` items, at least 16."""
    return max(16, n_items // ITEMS_PER_TOPIC)


def catalog(n_items: int) -> pa.Table:
    """Items ``i0`` … with a title naming the item's topic (``i % topics(n_items)``)."""
    numbers = np.arange(n_items)
    title = pc.binary_join_element_wise(
        prefixed("Item ", numbers), prefixed("topic ", numbers % topics(n_items)), " about "
    )
    return pa.table({"item_id": prefixed("i", numbers), "title": title}).cast(ITEMS)


def clustered_embeddings(n_items: int, dim: int = EMBEDDING_DIM, seed: int = 0) -> np.ndarray:
    """(n_items, dim) float32 unit rows: item i is its topic's random centre plus Gaussian
    spread (sd ``TOPIC_SPREAD``) in a ``LATENT_DIM``-dimensional subspace, plus isotropic
    noise (sd ``NOISE``), normalized. Written in chunks: no temporary of the full size."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((topics(n_items), LATENT_DIM), dtype=np.float32)
    basis = np.linalg.qr(rng.standard_normal((dim, LATENT_DIM)))[0].T.astype(np.float32)
    out = np.empty((n_items, dim), dtype=np.float32)
    for lo in range(0, n_items, 1 << 16):
        rows = np.arange(lo, min(lo + (1 << 16), n_items))
        z = centers[rows % len(centers)]
        z += TOPIC_SPREAD * rng.standard_normal(z.shape, dtype=np.float32)
        x = z @ basis
        x += NOISE * rng.standard_normal(x.shape, dtype=np.float32)
        out[rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def write_csv_source(
    folder: Path, n_rows: int, n_items: int, seed: int = 0, n_users: int | None = None
) -> dict[str, Path]:
    """The interaction log and the catalog as the two files of a ``csv`` source."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"interactions": folder / "interactions.csv", "items": folder / "items.csv"}
    options = pacsv.WriteOptions(quoting_style="needed")
    log = interaction_log(n_rows, n_items, seed, n_users)
    pacsv.write_csv(log, paths["interactions"], options)
    pacsv.write_csv(catalog(n_items), paths["items"], options)
    return paths


def write_embedded_catalog(paths: DatasetPaths, n_items: int, seed: int = 0) -> None:
    """A validated items table, ``item_emb.npy`` and its manifest, as validate and embed
    leave them for the sids stage."""
    table = catalog(n_items)
    for path in (paths.validated("items"), paths.item_emb):
        path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, paths.validated("items"))
    np.save(paths.item_emb, clustered_embeddings(n_items, seed=seed))
    manifest = {
        "dataset": paths.dataset,
        "encoder": f"synthetic: {topics(n_items)} topics (bench/synthetic.py)",
        "dim": EMBEDDING_DIM,
        "items": n_items,
        "item_ids_sha256": catalog_fingerprint(table.column("item_id").to_pylist()),
        "normalized": True,
    }
    paths.item_emb_manifest.write_text(json.dumps(manifest, indent=2) + "\n")


def random_sid_map(
    n_items: int, levels: int = 3, codebook_size: int = 256, seed: int = 0
) -> dict[str, list[int]]:
    """Items ``i0`` … with distinct SIDs drawn uniformly (as ``bench.decoding`` draws them)."""
    keys = np.random.default_rng(seed).choice(codebook_size**levels, n_items, replace=False)
    codes = np.stack(
        [(keys // codebook_size ** (levels - 1 - lv)) % codebook_size for lv in range(levels)], 1
    )
    return dict(zip(prefixed("i", np.arange(n_items)).to_pylist(), codes.tolist(), strict=True))
