"""RQ-VAE: item text embeddings → semantic IDs (one code per level).

An MLP autoencoder whose latent is quantized by residual vector quantization: level l picks
the codeword nearest to what levels < l left unexplained (Zeghidour et al. 2021, "SoundStream";
Rajput et al. 2023, "Recommender Systems with Generative Retrieval" (TIGER); LC-Rec and
MiniOneRec use the same recipe). Codebooks are learned by the VQ-VAE loss (van den Oord et
al. 2017), not by EMA; k-means initialization and dead-code re-seeding keep every code in use.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.checks import require
from models.kmeans import kmeans
from sidrec.progress import ProgressBar

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RQVAEConfig:
    """Architecture and training options (defaults: LC-Rec / MiniOneRec, scaled to CPU)."""

    # --- architecture
    hidden_dims: tuple[int, ...] = (512, 256, 128)
    """Encoder MLP widths between the input and the code; the decoder mirrors them."""
    code_dim: int = 32
    """Dimension of the latent that is quantized (and of every codeword)."""
    levels: int = 3
    """Residual quantization levels = semantic ID length (before collision handling)."""
    codebook_size: int = 256
    """Codewords per level (K)."""
    dropout: float = 0.0
    """Dropout after each hidden ReLU of encoder and decoder."""
    # --- loss
    beta: float = 0.25
    """Commitment weight: loss per level = ||sg[r] - e||² + beta·||r - sg[e]||² (VQ-VAE)."""
    # --- optimization
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    epochs: int = 300
    """Passes over the catalog."""
    batch_size: int = 1024
    """Items per mini-batch."""
    # --- codebook health and checkpoint selection
    kmeans_init: bool = True
    """Initialize each level's codebook by k-means on that level's residuals before training."""
    dead_code_every: int = 50
    """Epochs between re-seeding codewords no item uses (0 disables)."""
    eval_every: int = 10
    """Epochs between collision-rate checks; the checkpoint with the fewest collisions is kept."""
    seed: int = 0
    """Seeds torch, numpy, k-means, batch shuffling and dead-code re-seeding."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_dims", tuple(self.hidden_dims))
        checks = [
            (
                "hidden_dims",
                all(isinstance(h, int) and h >= 1 for h in self.hidden_dims),
                "positive ints",
            ),
            ("code_dim", self.code_dim >= 1, ">= 1"),
            ("levels", self.levels >= 1, ">= 1"),
            ("codebook_size", self.codebook_size >= 2, ">= 2"),
            ("dropout", 0.0 <= self.dropout < 1.0, "in [0, 1)"),
            ("beta", self.beta >= 0, ">= 0"),
            ("lr", self.lr > 0, "> 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("epochs", self.epochs >= 1, ">= 1"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("dead_code_every", self.dead_code_every >= 0, ">= 0 (0 disables re-seeding)"),
            ("eval_every", self.eval_every >= 1, ">= 1"),
            ("seed", self.seed >= 0, ">= 0"),
        ]
        require(self, checks)


class RQVAEOutput(NamedTuple):
    recon: torch.Tensor
    """(N, input_dim) decoder output."""
    codes: torch.Tensor
    """(N, levels) long: codeword index per level."""
    recon_loss: torch.Tensor
    """MSE between ``recon`` and the input."""
    quant_loss: torch.Tensor
    """VQ loss averaged over levels (codebook + beta · commitment)."""
    loss: torch.Tensor
    """recon_loss + quant_loss."""


class _Quantized(NamedTuple):
    quantized: torch.Tensor
    """(N, code_dim) sum of the chosen codewords (carries codebook gradients)."""
    codes: torch.Tensor
    residuals: torch.Tensor
    """(N, levels, code_dim) residual entering each level."""
    loss: torch.Tensor


def _mlp(dims: list[int], dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        layers.append(nn.Linear(d_in, d_out))
        if i < len(dims) - 2:  # no activation on the code / the reconstruction
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def _squared_distances(r: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """(N, K) squared L2 distances of residuals ``r`` to every codeword."""
    return (r * r).sum(1, keepdim=True) - 2 * r @ codebook.T + (codebook * codebook).sum(1)[None, :]


class RQVAE(nn.Module):
    """MLP encoder → residual quantizer (``levels`` codebooks) → mirrored MLP decoder."""

    def __init__(self, *, input_dim: int, config: RQVAEConfig):
        super().__init__()
        if input_dim < 1:
            raise ValueError(f"input_dim must be >= 1, got {input_dim}")
        self.input_dim = input_dim
        self.config = config
        dims = [input_dim, *config.hidden_dims, config.code_dim]
        self.encoder = _mlp(dims, config.dropout)
        self.decoder = _mlp(dims[::-1], config.dropout)
        shape = (config.levels, config.codebook_size, config.code_dim)
        bound = 1.0 / config.codebook_size  # LC-Rec's init when k-means init is off
        self.codebooks = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        """(levels, codebook_size, code_dim): one codebook per level."""

    def _quantize(self, z: torch.Tensor) -> _Quantized:
        """Residual VQ of latents ``z``; the VQ loss is averaged over levels (as in LC-Rec)."""
        residual, quantized = z, torch.zeros_like(z)
        codes, residuals, losses = [], [], []
        for book in self.codebooks:
            idx = _squared_distances(residual.detach(), book.detach()).argmin(1)
            e = book[idx]
            losses.append(
                F.mse_loss(e, residual.detach())
                + self.config.beta * F.mse_loss(residual, e.detach())
            )
            codes.append(idx)
            residuals.append(residual)
            quantized = quantized + e
            residual = residual - e.detach()  # as vector-quantize-pytorch's ResidualVQ
        loss = torch.stack(losses).mean()
        return _Quantized(quantized, torch.stack(codes, 1), torch.stack(residuals, 1), loss)

    def forward(self, x: torch.Tensor) -> RQVAEOutput:
        z = self.encoder(x)
        q = self._quantize(z)
        z_q = z + (q.quantized - z).detach()  # straight-through estimator to the encoder
        recon = self.decoder(z_q)
        recon_loss = F.mse_loss(recon, x)
        return RQVAEOutput(recon, q.codes, recon_loss, q.loss, recon_loss + q.loss)

    @contextmanager
    def _inference(self) -> Iterator[None]:
        """No gradients and no dropout for the block; the previous train/eval mode is restored."""
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.train(was_training)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(N, levels) long codes (deterministic: dropout off, no gradients)."""
        with self._inference():
            return self._quantize(self.encoder(x)).codes

    def residuals(self, x: torch.Tensor) -> torch.Tensor:
        """(N, levels, code_dim) residual entering each level; level l's code is its nearest codeword."""
        with self._inference():
            return self._quantize(self.encoder(x)).residuals

    def codebook(self, level: int) -> torch.Tensor:
        """(codebook_size, code_dim) codewords of ``level`` (a detached view)."""
        if not 0 <= level < self.config.levels:
            raise ValueError(f"level must be in [0, {self.config.levels}), got {level}")
        return self.codebooks[level].detach()

    def init_codebooks_kmeans(self, x: torch.Tensor) -> None:
        """Set each level's codebook to k-means centroids of that level's residuals, level by level."""
        with self._inference():
            residual = self.encoder(x)
            for level, book in enumerate(self.codebooks):
                centroids = kmeans(
                    residual.numpy(), self.config.codebook_size, seed=self.config.seed + level
                )
                book.copy_(torch.from_numpy(centroids))
                residual = residual - book[_squared_distances(residual, book).argmin(1)]

    def reseed_dead_codes(
        self, x: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> int:
        """Replace every codeword no item of ``x`` uses by the residual of a random item; returns how many.

        Items are drawn from codes shared by several items, so moving them does not kill their
        old code. Levels are processed in order (re-seeding level l changes later residuals).
        """
        if generator is None:
            generator = torch.Generator().manual_seed(self.config.seed)
        reseeded = 0
        with self._inference():
            z = self.encoder(x)
            for level, book in enumerate(self.codebooks):
                q = self._quantize(z)
                counts = torch.bincount(q.codes[:, level], minlength=self.config.codebook_size)
                dead = (counts == 0).nonzero().flatten()
                candidates = (counts[q.codes[:, level]] > 1).nonzero().flatten()
                if len(dead) == 0 or len(candidates) == 0:
                    continue
                chosen = candidates[
                    torch.randperm(len(candidates), generator=generator)[: len(dead)]
                ]
                book[dead[: len(chosen)]] = q.residuals[chosen, level]
                reseeded += len(chosen)
        return reseeded


# --- training


class RQVAETrainResult(NamedTuple):
    model: RQVAE
    """The best checkpoint, in eval mode."""
    best_epoch: int
    best_collision_rate: float
    best_loss: float
    history: list[dict[str, Any]]
    """One record per evaluation: epoch, loss, recon_loss, quant_loss, collision_rate, level_usage."""


def collision_rate(codes: torch.Tensor) -> float:
    """Share of items whose code tuple another item already has: (n − distinct tuples) / n."""
    return (len(codes) - len(torch.unique(codes, dim=0))) / len(codes)


def _validate_embeddings(embeddings: np.ndarray, config: RQVAEConfig) -> np.ndarray:
    x = np.asarray(embeddings)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D (items, dim) array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"embeddings must be numeric, got dtype {x.dtype}")
    bad = np.flatnonzero(~np.isfinite(x).all(1))
    if len(bad):
        raise ValueError(
            f"embeddings has {len(bad)} rows with NaN or inf (first: {bad[:5].tolist()}); "
            "re-embed those items or drop them"
        )
    if len(x) < config.codebook_size:
        raise ValueError(
            f"RQ-VAE needs at least codebook_size={config.codebook_size} items to fill a codebook, "
            f"got {len(x)}; lower codebook_size"
        )
    return np.ascontiguousarray(x, dtype=np.float32)


def _train_epoch(
    model: RQVAE, data: torch.Tensor, optimizer: torch.optim.Optimizer, generator: torch.Generator
) -> None:
    model.train()
    for batch in torch.randperm(len(data), generator=generator).split(model.config.batch_size):
        loss = model(data[batch]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def _evaluate(model: RQVAE, data: torch.Tensor, epoch: int) -> dict[str, Any]:
    """Full-catalog losses, collision rate and per-level share of codes in use (eval mode)."""
    with model._inference():
        out = model(data)
    k = model.config.codebook_size
    usage = [len(torch.unique(out.codes[:, level])) / k for level in range(model.config.levels)]
    return {
        "epoch": epoch,
        "loss": float(out.loss),
        "recon_loss": float(out.recon_loss),
        "quant_loss": float(out.quant_loss),
        "collision_rate": collision_rate(out.codes),
        "level_usage": usage,
    }


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Torch on one thread for the block, the caller's setting restored after.

    With two threads the codebooks' gradient (rows gathered by code index, their gradients
    summed back per row) came out in a varying order, so one seed gave different SIDs from run
    to run. One thread makes training reproducible."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_rqvae(
    embeddings: np.ndarray, config: RQVAEConfig, *, progress: bool = True
) -> RQVAETrainResult:
    """Train an RQ-VAE on item embeddings; returns the checkpoint with the fewest collisions.

    Reproducible: the same embeddings and config give the same weights (one torch thread)."""
    with _one_torch_thread():
        return _train_rqvae(embeddings, config, progress=progress)


def _train_rqvae(
    embeddings: np.ndarray, config: RQVAEConfig, *, progress: bool
) -> RQVAETrainResult:
    data = torch.from_numpy(_validate_embeddings(embeddings, config))
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = RQVAE(input_dim=data.shape[1], config=config)
    if config.kmeans_init:
        model.init_codebooks_kmeans(data)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    history: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    best_state: dict[str, Any] = {}
    bar = ProgressBar(range(1, config.epochs + 1), desc="rqvae", disable=not progress)
    for epoch in bar:
        _train_epoch(model, data, optimizer, generator)
        if epoch % config.eval_every == 0 or epoch == config.epochs:
            record = _evaluate(model, data, epoch)
            history.append(record)
            bar.set_postfix(
                loss=f"{record['loss']:.4f}", collisions=f"{record['collision_rate']:.4f}"
            )
            key = (record["collision_rate"], record["loss"])
            if best is None or key < (best["collision_rate"], best["loss"]):
                best, best_state = record, copy.deepcopy(model.state_dict())
        if config.dead_code_every and epoch % config.dead_code_every == 0 and epoch < config.epochs:
            model.reseed_dead_codes(data, generator=generator)
    assert best is not None, "the last epoch is always evaluated"
    model.load_state_dict(best_state)
    model.eval()
    logger.info(
        "RQ-VAE: best epoch %d of %d, collision rate %.4f, loss %.5f, level usage %s",
        best["epoch"],
        config.epochs,
        best["collision_rate"],
        best["loss"],
        [round(u, 3) for u in best["level_usage"]],
    )
    return RQVAETrainResult(model, best["epoch"], best["collision_rate"], best["loss"], history)


# --- persistence (weights_only-loadable: plain dicts, lists, ints, floats, tensors)


def rqvae_state(model: RQVAE) -> dict[str, Any]:
    config = dataclasses.asdict(model.config)
    config["hidden_dims"] = list(config["hidden_dims"])
    return {"input_dim": model.input_dim, "config": config, "state_dict": model.state_dict()}


def rqvae_from_state(state: Any) -> RQVAE:
    """Rebuild a model from :func:`rqvae_state` output (extra keys, e.g. ``method``, are ignored)."""
    if not isinstance(state, dict) or not {"input_dim", "config", "state_dict"} <= state.keys():
        raise ValueError(
            "not an RQ-VAE checkpoint: expected a dict with input_dim, config and state_dict"
        )
    try:
        config = RQVAEConfig(
            **{**state["config"], "hidden_dims": tuple(state["config"]["hidden_dims"])}
        )
        model = RQVAE(input_dim=int(state["input_dim"]), config=config)
        model.load_state_dict(state["state_dict"])
    except (TypeError, KeyError, RuntimeError) as exc:
        raise ValueError(f"not a usable RQ-VAE checkpoint ({exc})") from exc
    return model.eval()


def save_rqvae(model: RQVAE, path: Path) -> None:
    torch.save(rqvae_state(model), path)


def load_rqvae(path: Path) -> RQVAE:
    if not path.exists():
        raise ValueError(f"RQ-VAE checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or foreign files
        raise ValueError(f"{path} is not a readable RQ-VAE checkpoint ({exc})") from exc
    try:
        return rqvae_from_state(state)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
