"""One interface over the quantizers the ``sids`` stage can train (RQ-VAE, RQ-KMeans), and the
single file format they are saved in (``quantizer.pt``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

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


def save_quantizer(quantizer: Quantizer, path: Path) -> None:
    torch.save(quantizer.state(), path)


def load_quantizer(path: Path) -> Quantizer:
    if not path.exists():
        raise InputError(
            "saved quantizer not found (incremental mode needs a previous full build)", path=path
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt files
        raise InputError(f"not a readable quantizer file ({exc})", path=path) from None
    method = state.get("method") if isinstance(state, dict) else None
    if method == "rqkmeans":
        return RQKMeans.from_state(state)
    if method == "rqvae":
        from models.rqvae import rqvae_from_state

        return RQVAEQuantizer(rqvae_from_state(state))
    raise InputError(f"unknown quantizer method {method!r}", path=path)
