"""Residual k-means (RQ-KMeans): a fast CPU quantizer baseline for semantic IDs.

Level l runs k-means (faiss) on the residuals left by levels < l. With ``balanced=True``
each code holds at most ceil(n / K) items per level (size-constrained assignment), which
spreads items over the codebook and lowers collisions (as in OneRec's balanced RQ-KMeans).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.kmeans import kmeans, nearest


class RQKMeans:
    def __init__(
        self,
        *,
        levels: int,
        codebook_size: int,
        niter: int = 25,
        balanced: bool = False,
        seed: int = 0,
    ):
        if levels < 1 or codebook_size < 2:
            raise ValueError(
                f"need levels >= 1 and codebook_size >= 2, got {levels} and {codebook_size}"
            )
        self.levels = levels
        self.codebook_size = codebook_size
        self.niter = niter
        self.balanced = balanced
        self.seed = seed
        self.codebooks: list[np.ndarray] = []

    def fit(self, x: np.ndarray) -> np.ndarray:
        """Learn the codebooks; returns the training items' codes (items × levels)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        residual = x.copy()
        codes = np.empty((len(x), self.levels), dtype=np.int64)
        self.codebooks = []
        for level in range(self.levels):
            centroids = kmeans(
                residual, self.codebook_size, niter=self.niter, seed=self.seed + level
            )
            if self.balanced:
                assign = balanced_assign(
                    residual, centroids, math.ceil(len(x) / self.codebook_size)
                )
            else:
                assign = nearest(residual, centroids)[0]
            self.codebooks.append(centroids)
            codes[:, level] = assign
            residual -= centroids[assign]
        return codes

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Nearest-codeword codes for (new) items."""
        residual = np.ascontiguousarray(x, dtype=np.float32).copy()
        codes = np.empty((len(residual), self.levels), dtype=np.int64)
        for level, centroids in enumerate(self.codebooks):
            codes[:, level] = nearest(residual, centroids)[0]
            residual -= centroids[codes[:, level]]
        return codes

    def residual_before_last(self, x: np.ndarray, codes: np.ndarray) -> np.ndarray:
        residual = np.asarray(x, dtype=np.float32).copy()
        for level in range(self.levels - 1):
            residual -= self.codebooks[level][codes[:, level]]
        return residual

    def last_level_distances(self, x: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """(items × K) squared distances of each item's last-level residual to every codeword."""
        r = self.residual_before_last(x, codes)
        c = self.codebooks[-1]
        return (r * r).sum(1, keepdims=True) - 2 * r @ c.T + (c * c).sum(1)[None, :]

    def reconstruction_error(self, x: np.ndarray, codes: np.ndarray, chunk: int = 1 << 16) -> float:
        """Mean squared norm of what the codes leave unexplained (``chunk`` rows at a time:
        whole-catalog temporaries took GBs at 10^6 items)."""
        x = np.asarray(x, dtype=np.float32)
        errors = np.empty(len(x), dtype=np.float32)
        for lo in range(0, len(x), chunk):
            rows = slice(lo, lo + chunk)
            recon = sum(self.codebooks[level][codes[rows, level]] for level in range(self.levels))
            errors[rows] = ((x[rows] - recon) ** 2).sum(1)
        return float(errors.mean())

    def state(self) -> dict[str, Any]:
        return {
            "method": "rqkmeans",
            "levels": self.levels,
            "codebook_size": self.codebook_size,
            "niter": self.niter,
            "balanced": self.balanced,
            "seed": self.seed,
            "codebooks": [torch.from_numpy(c) for c in self.codebooks],
        }

    def save(self, path: Path) -> None:
        torch.save(self.state(), path)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RQKMeans:
        model = cls(
            levels=state["levels"],
            codebook_size=state["codebook_size"],
            niter=state["niter"],
            balanced=state["balanced"],
            seed=state["seed"],
        )
        model.codebooks = [c.numpy() for c in state["codebooks"]]
        return model


def balanced_assign(x: np.ndarray, centroids: np.ndarray, capacity: int) -> np.ndarray:
    """Assign each row to a centroid, at most ``capacity`` rows per centroid, preferring near ones.

    Rounds: every unassigned row proposes to its nearest centroid that still has room; each
    centroid accepts its closest proposers up to its remaining room. Terminates because every
    round fills at least one centroid or assigns every proposer.
    """
    k = len(centroids)
    assert capacity * k >= len(x), "capacity too small for the rows"
    dist = (
        (x * x).sum(1, keepdims=True)
        - 2 * x @ centroids.T
        + (centroids * centroids).sum(1)[None, :]
    )
    assign = np.full(len(x), -1, dtype=np.int64)
    room = np.full(k, capacity, dtype=np.int64)
    while (pending := np.flatnonzero(assign < 0)).size:
        d = np.where(room[None, :] > 0, dist[pending], np.inf)
        choice = d.argmin(1)
        order = np.lexsort((d[np.arange(len(pending)), choice], choice))
        chosen = choice[order]
        starts = np.r_[0, np.flatnonzero(np.diff(chosen)) + 1]
        rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        accept = rank < room[chosen]
        assign[pending[order[accept]]] = chosen[accept]
        np.subtract.at(room, chosen[accept], 1)
    return assign
