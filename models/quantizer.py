"""One interface over the quantizers the ``sids`` stage can train (RQ-VAE, RQ-KMeans), and the
single file format they are saved in (``quantizer.pt``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from models.rqkmeans import RQKMeans
from sidrec.errors import InputError


class Quantizer(Protocol):
    levels: int
    codebook_size: int

    def encode(self, x: np.ndarray) -> np.ndarray:
        """(items × levels) codes for embeddings ``x``."""
        ...

    def last_level_distances(self, x: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """(items × K) distances of each item's last-level residual to every last-level codeword."""
        ...

    def reconstruction_error(self, x: np.ndarray, codes: np.ndarray) -> float: ...

    def state(self) -> dict[str, Any]: ...


class RQVAEQuantizer:
    """The RQ-VAE module behind the :class:`Quantizer` interface (numpy in, numpy out)."""

    def __init__(self, model: Any):
        self.model = model.eval()
        self.levels = model.config.levels
        self.codebook_size = model.config.codebook_size

    @torch.no_grad()
    def encode(self, x: np.ndarray) -> np.ndarray:
        return self.model.encode(torch.from_numpy(np.asarray(x, dtype=np.float32))).numpy()

    @torch.no_grad()
    def last_level_distances(self, x: np.ndarray, codes: np.ndarray) -> np.ndarray:
        residual = self.model.residuals(torch.from_numpy(np.asarray(x, dtype=np.float32)))[:, -1]
        return torch.cdist(residual, self.model.codebook(self.levels - 1)).pow(2).numpy()

    @torch.no_grad()
    def reconstruction_error(self, x: np.ndarray, codes: np.ndarray) -> float:
        tensor = torch.from_numpy(np.asarray(x, dtype=np.float32))
        return float(self.model(tensor).recon_loss)

    def state(self) -> dict[str, Any]:
        from models.rqvae import rqvae_state

        return {"method": "rqvae", **rqvae_state(self.model)}


class SavedQuantizer(NamedTuple):
    quantizer: Quantizer
    embedding: dict[str, Any]
    """How the embeddings it was trained on were made (empty for files saved without it)."""


def save_quantizer(
    quantizer: Quantizer, path: Path, *, embedding: Mapping[str, Any] | None = None
) -> None:
    """The quantizer's state, plus ``embedding``: what new items' embeddings must match
    (plain values and tensors, as ``torch.load(weights_only=True)`` reads them)."""
    state = quantizer.state()
    if embedding is not None:
        state["embedding"] = dict(embedding)
    torch.save(state, path)


def load_quantizer(path: Path) -> SavedQuantizer:
    if not path.exists():
        raise InputError(
            "saved quantizer not found (incremental mode needs a previous full build)", path=path
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt files
        raise InputError(f"not a readable quantizer file ({exc})", path=path) from None
    if not isinstance(state, dict):
        raise InputError("not a quantizer file (expected a dict of its state)", path=path)
    method, embedding = state.get("method"), state.get("embedding") or {}
    if method == "rqkmeans":
        return SavedQuantizer(RQKMeans.from_state(state), embedding)
    if method == "rqvae":
        from models.rqvae import rqvae_from_state

        return SavedQuantizer(RQVAEQuantizer(rqvae_from_state(state)), embedding)
    raise InputError(f"unknown quantizer method {method!r}", path=path)
