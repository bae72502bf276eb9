"""RQ-VAE and faiss k-means on tiny random data (each test takes well under a few seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.kmeans import kmeans, nearest
from models.rqvae import (
    RQVAE,
    RQVAEConfig,
    RQVAEOutput,
    RQVAETrainResult,
    collision_rate,
    load_rqvae,
    rqvae_from_state,
    rqvae_state,
    save_rqvae,
    train_rqvae,
)

K = 8


def tiny_config(**overrides: object) -> RQVAEConfig:
    base: dict[str, object] = dict(
        hidden_dims=(32,),
        code_dim=8,
        levels=3,
        codebook_size=K,
        epochs=40,
        batch_size=64,
        eval_every=5,
        dead_code_every=20,
    )
    return RQVAEConfig(**{**base, **overrides})  # type: ignore[arg-type]


def unit_vectors(n: int = 300, d: int = 16, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def clustered(k: int = K, per_cluster: int = 40, d: int = 16, seed: int = 0) -> np.ndarray:
    """``k`` well-separated blobs."""
    rng = np.random.default_rng(seed)
    centers = 5 * rng.standard_normal((k, d))
    x = np.repeat(centers, per_cluster, axis=0) + 0.05 * rng.standard_normal((k * per_cluster, d))
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def trained() -> tuple[RQVAETrainResult, torch.Tensor]:
    x = unit_vectors()
    # lr=3e-3: here the best checkpoint is not the last epoch, so restoring it is exercised
    return train_rqvae(x, tiny_config(lr=3e-3), progress=False), torch.from_numpy(x)


def test_forward_returns_named_tuple_with_expected_shapes() -> None:
    model = RQVAE(input_dim=16, config=tiny_config())
    out = model(torch.from_numpy(unit_vectors(n=20)))
    assert isinstance(out, RQVAEOutput)
    assert out.recon.shape == (20, 16)
    assert out.codes.shape == (20, 3) and out.codes.dtype == torch.long
    assert int(out.codes.min()) >= 0 and int(out.codes.max()) < K
    assert out.recon_loss.ndim == out.quant_loss.ndim == out.loss.ndim == 0
    torch.testing.assert_close(out.loss, out.recon_loss + out.quant_loss)


def test_training_reduces_loss_and_changes_every_parameter() -> None:
    x = unit_vectors()
    config = tiny_config(kmeans_init=False, dead_code_every=0)
    torch.manual_seed(config.seed)  # train_rqvae builds its model right after the same seeding
    initial = RQVAE(input_dim=16, config=config)
    with torch.no_grad():
        initial_loss = float(initial(torch.from_numpy(x)).loss)

    result = train_rqvae(x, config, progress=False)

    assert result.best_loss < initial_loss
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    trained_params = dict(result.model.named_parameters())
    for name, before in initial.named_parameters():
        assert not torch.equal(before, trained_params[name]), f"{name} did not change"


def test_kmeans_init_uses_every_level1_code_on_clustered_data() -> None:
    x = torch.from_numpy(clustered())
    model = RQVAE(input_dim=16, config=tiny_config())
    model.init_codebooks_kmeans(x)
    assert len(torch.unique(model.encode(x)[:, 0])) == K


def test_encode_is_deterministic_and_agrees_with_residuals_and_codebooks() -> None:
    x = torch.from_numpy(unit_vectors())
    model = RQVAE(input_dim=16, config=tiny_config(dropout=0.5))
    model.init_codebooks_kmeans(x)
    model.train()  # dropout must not leak into encode
    codes = model.encode(x)
    assert torch.equal(codes, model.encode(x))
    assert model.training, "encode must restore the train mode"

    residuals = model.residuals(x)
    assert residuals.shape == (300, 3, 8)
    for level in range(3):
        book = model.codebook(level)
        assert book.shape == (K, 8)
        dist = torch.cdist(residuals[:, level], book).pow(2)
        chosen = dist.gather(1, codes[:, level : level + 1]).squeeze(1)
        torch.testing.assert_close(chosen, dist.min(1).values, atol=1e-5, rtol=1e-5)
        if level + 1 < 3:
            torch.testing.assert_close(
                residuals[:, level + 1], residuals[:, level] - book[codes[:, level]]
            )


def test_reseeding_revives_a_dead_code() -> None:
    x = torch.from_numpy(unit_vectors())
    model = RQVAE(input_dim=16, config=tiny_config())
    model.init_codebooks_kmeans(x)
    with torch.no_grad():
        model.codebooks[0, 3] = 1e3  # far from every residual: nobody picks it
    assert not (model.encode(x)[:, 0] == 3).any()

    assert model.reseed_dead_codes(x) >= 1
    assert (model.encode(x)[:, 0] == 3).any()


def test_best_checkpoint_matches_recomputed_collision_rate(
    trained: tuple[RQVAETrainResult, torch.Tensor],
) -> None:
    result, x = trained
    assert not result.model.training
    assert result.best_collision_rate == collision_rate(result.model.encode(x))
    assert result.best_collision_rate == min(r["collision_rate"] for r in result.history)
    assert result.best_epoch in [r["epoch"] for r in result.history]
    assert result.history[-1]["epoch"] == 40
    assert set(result.history[0]) == {
        "epoch",
        "loss",
        "recon_loss",
        "quant_loss",
        "collision_rate",
        "level_usage",
    }
    assert len(result.history[0]["level_usage"]) == 3


def test_save_load_round_trip_gives_identical_codes(
    trained: tuple[RQVAETrainResult, torch.Tensor], tmp_path: Path
) -> None:
    result, x = trained
    path = tmp_path / "rqvae.pt"
    save_rqvae(result.model, path)
    loaded = load_rqvae(path)
    assert loaded.config == result.model.config
    assert torch.equal(loaded.encode(x), result.model.encode(x))
    # the quantizer file adds a "method" key to the same state
    again = rqvae_from_state({"method": "rqvae", **rqvae_state(result.model)})
    assert torch.equal(again.encode(x), result.model.encode(x))


def test_load_rejects_missing_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not found"):
        load_rqvae(tmp_path / "missing.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable RQ-VAE checkpoint"):
        load_rqvae(tmp_path / "garbage.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not an RQ-VAE checkpoint"):
        load_rqvae(tmp_path / "other.pt")


def _with_nan_rows() -> np.ndarray:
    x = unit_vectors()
    x[[4, 7]] = np.nan
    return x


@pytest.mark.parametrize(
    ("embeddings", "message"),
    [
        (_with_nan_rows(), r"2 rows with NaN or inf \(first: \[4, 7\]\)"),
        (unit_vectors(n=K - 1), "at least codebook_size=8 items.*got 7"),
        (unit_vectors()[0], "2-D"),
    ],
    ids=["nan-rows", "fewer-items-than-codes", "1-d"],
)
def test_bad_embeddings_raise_helpful_errors(embeddings: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        train_rqvae(embeddings, tiny_config(), progress=False)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", 0.0),
        ("levels", 0),
        ("codebook_size", 1),
        ("dropout", 1.0),
        ("eval_every", 0),
        ("hidden_dims", (8, 0)),
    ],
)
def test_bad_config_values_raise(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"RQVAEConfig\.{field} must be"):
        tiny_config(**{field: value})


def test_kmeans_and_nearest() -> None:
    x = clustered()
    centroids = kmeans(x, K)
    assert centroids.shape == (K, 16) and centroids.dtype == np.float32
    idx, dist = nearest(x, centroids)
    assert idx.dtype == np.int64 and len(np.unique(idx)) == K
    np.testing.assert_allclose(dist, ((x - centroids[idx]) ** 2).sum(1), rtol=1e-4, atol=1e-4)


def test_kmeans_rejects_fewer_points_than_centroids() -> None:
    with pytest.raises(ValueError, match="n=5 < k=8"):
        kmeans(unit_vectors(n=5), 8)


def test_training_is_reproducible_with_two_threads() -> None:
    # the size at which two torch threads summed the codebooks' gradient in a varying order
    x = unit_vectors(n=2048, d=448)
    config = tiny_config(
        hidden_dims=(512, 256, 128), code_dim=32, codebook_size=256, epochs=2, batch_size=1024
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [train_rqvae(x, config, progress=False).model.state_dict() for _ in range(2)]
    finally:
        torch.set_num_threads(threads)
    assert runs[0].keys() == runs[1].keys()
    for name, weights in runs[0].items():
        assert torch.equal(weights, runs[1][name]), f"{name} differs between two runs"
    assert torch.get_num_threads() == threads  # training leaves the caller's setting alone
