"""k-means and nearest-centroid search through faiss (used by RQ-KMeans and RQ-VAE init)."""

from __future__ import annotations

import faiss
import numpy as np


def _as_matrix(x: np.ndarray, name: str) -> np.ndarray:
    """A C-contiguous float32 (n, d) copy-if-needed of ``x``, as faiss requires."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n, d) array, got shape {x.shape}")
    return x


def kmeans(x: np.ndarray, k: int, *, niter: int = 25, seed: int = 0) -> np.ndarray:
    """(k, d) float32 centroids of the rows of ``x`` (Lloyd's algorithm, faiss).

    Every row is used (no subsampling) and faiss's "too few points per centroid" warning is
    silenced: small catalogs are the normal case here, not a mistake.
    """
    x = _as_matrix(x, "x")
    n, d = x.shape
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n < k:
        raise ValueError(f"k-means needs at least as many points as centroids: n={n} < k={k}")
    km = faiss.Kmeans(
        d,
        k,
        niter=niter,
        seed=seed,
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=max(1, n),
    )
    km.train(x)
    centroids: np.ndarray = np.asarray(km.centroids, dtype=np.float32).reshape(k, d)
    return centroids


def nearest(x: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index (int64, (n,)) and squared L2 distance ((n,)) of each row's nearest centroid."""
    x = _as_matrix(x, "x")
    centroids = _as_matrix(centroids, "centroids")
    if x.shape[1] != centroids.shape[1]:
        raise ValueError(f"x has dimension {x.shape[1]} but centroids have {centroids.shape[1]}")
    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    dist, idx = index.search(x, 1)
    return idx[:, 0].astype(np.int64), dist[:, 0]
