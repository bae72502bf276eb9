"""The sids stage: collision-free, equal-length SIDs; incremental mode; MiniOneRec import; bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from models.sid import collision_stats, read_sid_map, to_minionerec_index
from sidrec.errors import ConfigError, InputError
from tasks.sids import sids

N_ITEMS = 120


@pytest.fixture
def sids_settings(project, make_settings):
    """``sids_settings(**sids)``: the project's settings with these sids keys replaced."""

    def make(**sids_cfg):
        cfg = {"method": "rqkmeans", "levels": 3, "codebook_size": 8, **sids_cfg}
        return make_settings(project, project={"dataset": "cat"}, sids=cfg)

    return make


def _clustered_embeddings(n: int, seed: int = 0, duplicates: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(6, 16))
    emb = centers[rng.integers(0, 6, n)] + 0.05 * rng.normal(size=(n, 16))
    emb[1 : 1 + duplicates] = emb[0]  # identical items must still get distinct SIDs
    return (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def catalog(sids_settings, write_validated_catalog, write_embeddings):
    settings = sids_settings()
    ids = write_validated_catalog(settings, N_ITEMS)
    write_embeddings(settings, _clustered_embeddings(N_ITEMS), ids)
    return ids


@pytest.mark.parametrize("balanced", [False, True])
def test_full_build_is_collision_free_with_equal_lengths(catalog, balanced, sids_settings):
    settings = sids_settings(codebook_size=16, rqkmeans={"balanced": balanced})
    result = sids(settings)
    sid_map = read_sid_map(settings.paths.sid_map)
    assert list(sid_map) == catalog
    assert len({len(v) for v in sid_map.values()}) == 1
    assert collision_stats(np.array(list(sid_map.values()))).collision_rate == 0.0
    m = result.metrics
    assert m["collision_rate_before"] > 0 and m["collision_rate_after"] == 0.0
    assert m["largest_collision_group"] >= 7  # the 7 identical embeddings
    assert [u["level"] for u in m["level_usage"]] == [0, 1, 2] and not m["extra_level"]
    assert m["reassigned_last_level"] >= 6
    assert all(0 < u["usage"] <= 1 and u["perplexity"] >= 1 for u in m["level_usage"])
    assert m["reconstruction_error"] > 0
    assert (
        settings.paths.quantizer.exists()
        and settings.paths.code_usage_plot.read_bytes()[:4] == b"\x89PNG"
    )
    assert json.loads(settings.paths.metrics("sids").read_text())["items"] == N_ITEMS


def test_incremental_mode_keeps_existing_sids(
    catalog, write_embeddings, write_validated_catalog, sids_settings
):
    settings = sids_settings()
    sids(settings)
    before = read_sid_map(settings.paths.sid_map)
    # five new items arrive, one of them identical to an existing item
    new_ids = write_validated_catalog(settings, N_ITEMS + 5)
    emb = np.concatenate(
        [_clustered_embeddings(N_ITEMS), _clustered_embeddings(5, seed=1, duplicates=0)]
    )
    emb[N_ITEMS] = emb[0]
    write_embeddings(settings, emb, new_ids)
    result = sids(sids_settings(incremental=True))
    after = read_sid_map(settings.paths.sid_map)
    assert {k: after[k] for k in before} == before
    assert len(after) == N_ITEMS + 5 and result.metrics["new_items"] == 5
    assert collision_stats(np.array(list(after.values()))).collision_rate == 0.0


def test_incremental_without_previous_build_builds_the_first_map(catalog, sids_settings):
    # the first scheduled retrain (sids.incremental=true) has no map to extend yet
    result = sids(sids_settings(incremental=True))
    assert result.metrics["mode"] == "full"
    assert len(read_sid_map(sids_settings().paths.sid_map)) == N_ITEMS


def test_import_minionerec_index(catalog, tmp_path, sids_settings):
    rng = np.random.default_rng(0)
    codes = rng.permutation(512)[: len(catalog), None] // [64, 8, 1] % 8
    sid_map = {item: [int(c) for c in row] for item, row in zip(catalog, codes, strict=True)}
    index = tmp_path / "x.index.json"
    index.write_text(json.dumps(to_minionerec_index(sid_map)))
    settings = sids_settings(import_index=str(index))
    result = sids(settings)
    assert read_sid_map(settings.paths.sid_map) == sid_map
    assert result.metrics["mode"] == "import" and not settings.paths.quantizer.exists()


def test_import_with_collisions_fails_unless_resolution_is_asked(
    project, catalog, tmp_path, sids_settings
):
    sid_map = {item: [k % 8, k // 8 % 8, k // 64] for k, item in enumerate(catalog)}
    sid_map[catalog[1]] = sid_map[catalog[0]]
    index = tmp_path / "x.index.json"
    index.write_text(json.dumps(to_minionerec_index(sid_map)))
    with pytest.raises(InputError, match=r"2 items share a SID"):
        sids(sids_settings(import_index=str(index)))
    assert not (project / "data" / "sids").exists()
    result = sids(sids_settings(import_index=str(index), resolve_imported_collisions=True))
    resolved = read_sid_map(sids_settings().paths.sid_map)
    assert result.metrics["extra_level"] and len(resolved[catalog[0]]) == 4
    assert resolved[catalog[2]] == [*sid_map[catalog[2]], 0]
    assert resolved[catalog[0]] != resolved[catalog[1]]


def test_codebook_too_small_is_a_config_error_before_training(project, catalog, sids_settings):
    with pytest.raises(
        ConfigError, match="120 items cannot get distinct SIDs from 2 levels x 8 codes"
    ):
        sids(sids_settings(levels=2))
    assert not (project / "data" / "sids").exists()


def test_bad_embeddings_are_rejected_and_nothing_is_written(
    project, catalog, write_embeddings, sids_settings
):
    settings = sids_settings()
    emb = _clustered_embeddings(N_ITEMS)
    emb[[4, 9]] = np.nan
    write_embeddings(settings, emb, catalog)
    with pytest.raises(
        InputError, match=r"2 embedding row\(s\) contain NaN or inf.*rows 4, 9.*'i4', 'i9'"
    ):
        sids(settings)
    write_embeddings(settings, _clustered_embeddings(N_ITEMS - 1), catalog[:-1])
    with pytest.raises(InputError, match="expected 120 rows"):
        sids(settings)
    assert not (project / "data" / "sids").exists()


def test_failed_rebuild_keeps_previous_map(catalog, sids_settings):
    settings = sids_settings()
    sids(settings)
    before = settings.paths.sid_map.read_bytes()
    items = pd.read_parquet(settings.paths.validated("items"))
    items.iloc[::-1].to_parquet(
        settings.paths.validated("items"), index=False
    )  # catalog order changed
    with pytest.raises(InputError, match="another catalog order"):
        sids(settings)
    assert settings.paths.sid_map.read_bytes() == before


def test_rqvae_build_then_incremental(
    catalog, write_embeddings, write_validated_catalog, sids_settings
):
    rqvae = {
        "hidden_dims": [32],
        "code_dim": 8,
        "epochs": 30,
        "eval_every": 10,
        "dead_code_every": 10,
    }
    settings = sids_settings(method="rqvae", codebook_size=16, rqvae=rqvae)
    result = sids(settings)
    assert result.metrics["method"] == "rqvae" and result.metrics["collision_rate_after"] == 0.0
    assert result.metrics["reconstruction_error"] > 0 and settings.paths.quantizer.exists()
    before = read_sid_map(settings.paths.sid_map)

    new_ids = write_validated_catalog(settings, N_ITEMS + 3)
    emb = np.concatenate(
        [_clustered_embeddings(N_ITEMS), _clustered_embeddings(3, seed=2, duplicates=0)]
    )
    write_embeddings(settings, emb, new_ids)
    sids(sids_settings(method="rqvae", codebook_size=16, rqvae=rqvae, incremental=True))
    after = read_sid_map(settings.paths.sid_map)
    assert {k: after[k] for k in before} == before and len(after) == N_ITEMS + 3
    assert collision_stats(np.array(list(after.values()))).collision_rate == 0.0
