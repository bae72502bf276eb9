"""The sids stage: collision-free, equal-length SIDs; incremental mode; MiniOneRec import; bad input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from models.sid import collision_stats, read_sid_map, to_minionerec_index
from sidrec.errors import ConfigError, InputError
from sidrec.io import AtomicOutputs
from sidrec.schemas import ITEMS
from tasks.shared.embeddings import item_embeddings
from tasks.shared.inputs import read_split
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
    assert m["embedding"] == "text" and m["items_without_interactions"] is None
    assert (
        settings.paths.quantizer.exists()
        and settings.paths.code_usage_plot.read_bytes()[:4] == b"\x89PNG"
    )
    assert json.loads(settings.paths.metrics("sids").read_text())["items"] == N_ITEMS


def test_more_duplicate_texts_than_codes_get_an_extra_level(
    sids_settings, write_validated_catalog, write_embeddings
):
    # 20 items with one text (identical embeddings) > 8 codes: refused before at any sids.levels
    settings = sids_settings(embedding="text")
    ids = write_validated_catalog(settings, N_ITEMS)
    write_embeddings(settings, _clustered_embeddings(N_ITEMS, duplicates=19), ids)
    result = sids(settings)
    sid_map = read_sid_map(settings.paths.sid_map)
    final = np.array([sid_map[i] for i in ids])
    assert result.metrics["extra_level"] and final.shape == (N_ITEMS, 4)
    assert collision_stats(final).collision_rate == 0.0 and final.max() < 8
    assert result.metrics["largest_collision_group"] >= 20
    assert (final[:20, :2] == final[0, :2]).all()  # the duplicates keep their first codes


def test_incremental_runs_give_new_duplicates_free_pairs_of_the_extra_level(
    project, sids_settings, write_validated_catalog, write_embeddings, files_under
):
    settings = sids_settings(embedding="text")
    ids = write_validated_catalog(settings, N_ITEMS)
    emb = _clustered_embeddings(N_ITEMS, duplicates=19)
    write_embeddings(settings, emb, ids)
    sids(settings)
    before = read_sid_map(settings.paths.sid_map)
    # three more copies of item 0: its SID (20 items) and its prefix's other codes take them
    new_ids = write_validated_catalog(settings, N_ITEMS + 3)
    write_embeddings(settings, np.concatenate([emb, emb[[0, 0, 0]]]), new_ids)
    result = sids(sids_settings(embedding="text", incremental=True))
    after = read_sid_map(settings.paths.sid_map)
    final = np.array(list(after.values()))
    assert {k: after[k] for k in before} == before and result.metrics["extra_level"]
    assert final.shape == (N_ITEMS + 3, 4) and final.max() < 8
    assert collision_stats(final).collision_rate == 0.0
    assert all(after[i][:2] == before[ids[0]][:2] for i in new_ids[N_ITEMS:])
    # 64 copies more overflow the prefix's 8 x 8 pairs: refused, the map kept
    kept = files_under("data/sids")
    many = write_validated_catalog(settings, N_ITEMS + 67)
    write_embeddings(settings, np.concatenate([emb, emb[[0] * 67]]), many)
    with pytest.raises(ConfigError, match=r"more than the 8x8 = 64 .* run a full rebuild"):
        sids(sids_settings(embedding="text", incremental=True))
    assert files_under("data/sids") == kept


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


@pytest.mark.parametrize("clustered", [True, False])  # a map with an extra level, one without
def test_incremental_runs_keep_a_removed_items_sid_free_and_give_it_back(
    catalog, write_embeddings, sids_settings, clustered
):
    keys = {} if clustered else {"codebook_size": 16}  # 16: no prefix group overflows
    settings = sids_settings(**keys)
    emb = _clustered_embeddings(N_ITEMS)
    if not clustered:
        emb = np.random.default_rng(3).normal(size=emb.shape).astype(np.float32)
    write_embeddings(settings, emb, catalog)
    sids(settings)
    before = read_sid_map(settings.paths.sid_map)
    assert len(next(iter(before.values()))) == (4 if clustered else 3)
    assert json.loads(settings.paths.retired_sids.read_text()) == {}
    items = pd.read_parquet(settings.paths.validated("items"))
    gone = catalog[50]  # not one of the duplicates: its SID is its own codes

    def write_catalog(rows: pd.DataFrame, vectors: np.ndarray) -> None:
        from sidrec.io import AtomicOutputs
        from sidrec.schemas import ITEMS

        with AtomicOutputs() as out:
            out.parquet(rows.reset_index(drop=True), settings.paths.validated("items"), ITEMS)
        write_embeddings(settings, vectors, rows["item_id"].tolist())

    # item 50 leaves; a new item with its very embedding (the quantizer gives it item 50's codes)
    newcomer = items.iloc[[50]].assign(item_id="new", title="A newcomer")
    keep = np.arange(N_ITEMS) != 50
    write_catalog(pd.concat([items[keep], newcomer]), np.vstack([emb[keep], emb[[50]]]))
    result = sids(sids_settings(incremental=True, **keys))
    after = read_sid_map(settings.paths.sid_map)
    retired = json.loads(settings.paths.retired_sids.read_text())
    assert retired == {gone: before[gone]} and gone not in after
    assert after["new"] != before[gone] and after["new"][:2] == before[gone][:2]
    assert {k: after[k] for k in before if k != gone} == {
        k: v for k, v in before.items() if k != gone
    }
    assert result.metrics["new_items"] == 1 and result.metrics["retired_items"] == 1
    # item 50 comes back: it takes its own SID again, and nothing is retired any more
    write_catalog(pd.concat([items, newcomer]), np.vstack([emb, emb[[50]]]))
    result = sids(sids_settings(incremental=True, **keys))
    again = read_sid_map(settings.paths.sid_map)
    assert again == {**after, gone: before[gone]} and result.metrics["new_items"] == 0
    assert json.loads(settings.paths.retired_sids.read_text()) == {}
    assert result.metrics["retired_items"] == 0


@pytest.mark.parametrize(
    ("retired", "match"),
    [
        ({"gone": "3,2"}, r"retired SIDs must be a JSON object of item_id → list"),
        ({"gone": [1, 2]}, r"the retired SIDs are not as long as the map's \(\[2, 4\] codes\)"),
        ({"a": [7, 7, 7, 7], "b": [7, 7, 7, 7]}, r"2 items share a SID"),
        ({"gone": [9, 0, 0, 0]}, r"codes beyond sids.codebook_size=8.*'gone'"),
    ],
)
def test_a_broken_retired_sids_file_stops_an_incremental_run_naming_it(
    catalog, sids_settings, files_under, retired, match
):
    settings = sids_settings()
    sids(settings)
    settings.paths.retired_sids.write_text(json.dumps(retired))
    kept = files_under("data/sids")
    with pytest.raises(InputError, match=match) as err:
        sids(sids_settings(incremental=True))
    assert "retired.json" in str(err.value) and files_under("data/sids") == kept


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


@pytest.mark.parametrize("embedding", ["text", "collaborative"])
def test_import_needs_no_embeddings(tmp_path, sids_settings, write_validated_catalog, embedding):
    # the index brings the codes: no item_emb.npy, no train split for factors
    settings = sids_settings(embedding=embedding)
    ids = write_validated_catalog(settings, 20)
    sid_map = {item: [k % 4, k // 4, 0] for k, item in enumerate(ids)}
    index = tmp_path / "x.index.json"
    index.write_text(json.dumps(to_minionerec_index(sid_map)))
    result = sids(sids_settings(embedding=embedding, import_index=str(index)))
    assert read_sid_map(settings.paths.sid_map) == sid_map
    assert (
        result.metrics["mode"] == "import" and result.metrics["items_without_interactions"] is None
    )


@pytest.mark.parametrize("changed", [{"codebook_size": 16}, {"levels": 2}, {"method": "rqvae"}])
def test_incremental_refuses_other_quantizer_keys(catalog, sids_settings, files_under, changed):
    sids(sids_settings())
    kept = files_under("data")
    with pytest.raises(InputError) as err:
        sids(sids_settings(incremental=True, **changed))
    key, value = next(iter(changed.items()))
    assert "this run asks for {" in str(err.value) and f"'{key}': {value!r}" in str(err.value)
    assert "sids.incremental=false" in str(err.value)
    assert files_under("data") == kept


@pytest.mark.parametrize(
    ("key", "value"), [("encoder", "paraphrase-other-encoder"), ("template", "{title}!")]
)
def test_incremental_refuses_text_embeddings_of_another_encoder_or_template(
    catalog, sids_settings, files_under, key, value
):
    """Same width, another vector space: new items would be coded in a space the quantizer
    never saw (the saved quantizer records the embed stage's encoder and template)."""
    settings = sids_settings()
    sids(settings)
    manifest = json.loads(settings.paths.item_emb_manifest.read_text())
    assert manifest[key] != value
    settings.paths.item_emb_manifest.write_text(json.dumps({**manifest, key: value}))
    kept = files_under("data/sids")
    with pytest.raises(InputError) as err:
        sids(sids_settings(incremental=True))
    assert f"'{key}': {value!r}" in str(err.value) and "(or embed) keys back" in str(err.value)
    assert files_under("data/sids") == kept
    settings.paths.item_emb_manifest.write_text(json.dumps(manifest))
    assert sids(sids_settings(incremental=True)).metrics["new_items"] == 0


def test_incremental_refuses_a_model_replaced_in_the_encoder_folder(catalog, sids_settings):
    # the embed stage's manifest names the folder and the hash of its files
    settings = sids_settings()
    manifest = json.loads(settings.paths.item_emb_manifest.read_text())
    write = settings.paths.item_emb_manifest.write_text
    write(json.dumps({**manifest, "encoder": "/m/enc", "encoder_files_sha256": "a" * 16}))
    sids(settings)
    write(json.dumps({**manifest, "encoder": "/m/enc", "encoder_files_sha256": "b" * 16}))
    with pytest.raises(InputError, match="'encoder_files_sha256': 'bbbb"):
        sids(sids_settings(incremental=True))
    write(json.dumps({**manifest, "encoder": "/m/enc", "encoder_files_sha256": "a" * 16}))
    assert sids(sids_settings(incremental=True)).metrics["new_items"] == 0


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


# ---------------------------------------------------------------- collaborative and hybrid SIDs

COLD = ["i55", "i56", "i57", "i58", "i59"]
"""Of the synthetic catalog with 50 users: i55 and i56 are only valid/test targets, nobody
consumed i57-i59."""


@pytest.fixture
def cold_catalog(project, synthetic_project):
    """``cold_catalog(**sids)``: settings of the synthetic project (60 items, 50 users, text
    SIDs already built) with these sids keys replaced."""
    syn = dataclasses.replace(synthetic_project, n_users=50)
    syn.write(syn.settings(project))

    def make(**sids_cfg):
        return syn.settings(project, sids={"collaborative_dim": 8, **sids_cfg})

    return make


def test_collaborative_factors_come_from_the_train_split_only(cold_catalog):
    settings = cold_catalog(embedding="collaborative")
    targets = {s: set(read_split(settings, s)["target"]) for s in ("valid", "test")}
    assert {"i55", "i56"} <= targets["valid"] | targets["test"]  # seen, but not in train
    text_map = settings.paths.sid_map.read_bytes()
    with pytest.raises(
        InputError,
        match=r"train.parquet: 5 catalog item\(s\) have no interactions in the train split.*"
        r"use sids.embedding=hybrid.*'i55', 'i56', 'i57', 'i58', 'i59'",
    ):
        sids(settings)
    with pytest.raises(
        ConfigError,
        match=r"sids.collaborative_dim=50 must be smaller than the train split's 50 users",
    ):
        sids(cold_catalog(embedding="hybrid", collaborative_dim=50))
    assert settings.paths.sid_map.read_bytes() == text_map  # nothing written


def test_hybrid_sids_code_cold_items_from_text_then_extend_incrementally(
    cold_catalog, write_embeddings
):
    settings = cold_catalog(embedding="hybrid")
    result = sids(settings)
    m = result.metrics
    assert m["embedding"] == "hybrid" and m["items_without_interactions"] == len(COLD)
    assert m["collision_rate_after"] == 0.0
    assert json.loads(settings.paths.metrics("sids").read_text())["embedding"] == "hybrid"
    sid_map = read_sid_map(settings.paths.sid_map)
    assert len({tuple(v) for v in sid_map.values()}) == 60  # cold items included
    assert len({len(v) for v in sid_map.values()}) == 1

    items = pd.read_parquet(settings.paths.validated("items"))
    emb = item_embeddings(settings, items).matrix
    cold = items["item_id"].isin(COLD).to_numpy()
    assert emb.shape == (60, 16 + 8)
    assert not emb[cold, 16:].any()  # a zero collaborative part, the text part as embedded
    np.testing.assert_allclose(np.linalg.norm(emb[~cold, 16:], axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(emb[:, :16], axis=1), 1.0, atol=1e-5)

    # three new catalog items: coded from their text, folded into the saved SVD basis
    more = pd.concat(
        [items, pd.DataFrame({"item_id": ["n0", "n1", "n2"], "title": ["N0", "N1", "N2"]})]
    )
    with AtomicOutputs() as out:
        out.parquet(more, settings.paths.validated("items"), ITEMS)
    text = np.load(settings.paths.item_emb)
    write_embeddings(settings, np.concatenate([text, text[:3]]), more["item_id"].tolist())
    result = sids(cold_catalog(embedding="hybrid", incremental=True))
    after = read_sid_map(settings.paths.sid_map)
    assert {k: after[k] for k in sid_map} == sid_map and len(after) == 63
    assert collision_stats(np.array(list(after.values()))).collision_rate == 0.0
    assert result.metrics["new_items"] == 3 and result.metrics["items_without_interactions"] == 8

    # extending the hybrid map with another kind of embedding is refused
    with pytest.raises(
        InputError, match=r"built from \{'source': 'hybrid'.*sids.incremental=false"
    ):
        sids(cold_catalog(embedding="text", incremental=True))
    with pytest.raises(InputError, match="rebuild the map"):
        sids(cold_catalog(embedding="hybrid", collaborative_weight=2.0, incremental=True))


def test_collaborative_extension_needs_factors_for_new_items_only(project, synthetic_project):
    """An item of the map whose users all left the train split keeps its SID; only items the
    run codes (new ones) must have interactions."""
    syn = synthetic_project
    settings = syn.settings(project, sids={"embedding": "collaborative", "collaborative_dim": 8})
    syn.write(settings)
    sids(settings)
    before = read_sid_map(settings.paths.sid_map)
    train = pd.read_parquet(settings.paths.split("train"))
    had = train["target"].eq("i0") | train["history"].map(lambda h: "i0" in list(h))
    left = train["user_id"].isin(set(train.loc[had, "user_id"]))
    train.loc[left, "user_id"] = "gone-" + train.loc[left, "user_id"]  # users the basis never saw
    with AtomicOutputs() as out:
        out.parquet(train, settings.paths.split("train"))
    extend = syn.settings(
        project, sids={"embedding": "collaborative", "collaborative_dim": 8, "incremental": True}
    )
    result = sids(extend)
    assert read_sid_map(settings.paths.sid_map) == before and result.metrics["new_items"] == 0


def test_interaction_pairs_are_the_distinct_pairs_of_targets_and_histories():
    from tasks.shared.embeddings import interaction_pairs

    train = pd.DataFrame(
        {
            "user_id": ["u1", "u1", "u1", "u2", "u2"],
            "history": [[], ["a"], ["a", "b"], ["c"], ["c", "a"]],
            "target": ["a", "b", "c", "a", "d"],
        }
    )
    expected = {("u1", "a"), ("u1", "b"), ("u1", "c"), ("u2", "c"), ("u2", "a"), ("u2", "d")}
    for chunk in (2, 20_000):  # repeats across chunks go too
        users, items = interaction_pairs(train, rows_per_chunk=chunk)
        assert len(users) == len(expected) and set(zip(users, items, strict=True)) == expected
    assert interaction_pairs(train.iloc[:0]) == ([], [])


def test_an_index_missing_catalog_items_is_refused_by_name(
    project, catalog, tmp_path, sids_settings
):
    sid_map = {item: [k % 8, k // 8 % 8, k // 64] for k, item in enumerate(catalog)}
    del sid_map[catalog[3]]
    index = tmp_path / "x.index.json"
    index.write_text(json.dumps(to_minionerec_index(sid_map)))
    with pytest.raises(InputError) as err:
        sids(sids_settings(import_index=str(index)))
    assert "1 catalog item(s) have no SID in the index" in str(err.value)
    assert str(index) in str(err.value) and repr(catalog[3]) in str(err.value)
    assert not (project / "data" / "sids").exists()


@pytest.mark.parametrize(
    ("n_items", "fits", "levels", "codebook_size", "match"),
    [
        (65, 64, 2, 8, r"65 items cannot get distinct SIDs from 2 levels x 8 codes \(64 SIDs\)"),
        (7, 8, 3, 8, r"the catalog has 7 items, fewer than sids.codebook_size=8"),
    ],
)
def test_a_codebook_that_cannot_code_the_catalog_is_a_config_error(
    sids_settings, n_items, fits, levels, codebook_size, match
):
    from tasks.sids import check_capacity

    cfg = sids_settings(levels=levels, codebook_size=codebook_size).sids
    with pytest.raises(ConfigError, match=match):
        check_capacity(n_items, cfg)
    check_capacity(fits, cfg)  # the bound itself is fine
