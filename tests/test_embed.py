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
