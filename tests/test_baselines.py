"""The baselines stage: SASRec trained once, saved atomically, loaded by grpo and evaluate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.baselines.sasrec import evaluate_sasrec, load_baseline, recommend, train_sasrec
from sidrec.errors import InputError
from sidrec.io import read_table
from sidrec.protocol import validation_half
from sidrec.schemas import SPLIT
from tasks.baselines import baselines, sasrec_config
from tasks.ingest import ingest
from tasks.sids import sids
from tasks.split import split
from tasks.validate import validate
from tests.conftest import csv_settings, write_csv_dataset, write_embeddings

N_ITEMS, N_USERS = 30, 24
ITEM_IDS = [f"i{n}" for n in range(N_ITEMS)]
SASREC = {"hidden": 16, "heads": 2, "blocks": 1, "max_epochs": 4, "patience": 2}


@pytest.fixture
def prepared(project):
    """Splits and a SID map of a 30-item catalog where item i is followed by item i + 1."""
    rows = [
        f"u{u},i{(u + k) % N_ITEMS},{1_600_000_000 + 1000 * u + k}"
        for u in range(N_USERS)
        for k in range(8)
    ]
    titles = [f"i{n},Item {n} in group {n % 5}" for n in range(N_ITEMS)]
    inter, items = write_csv_dataset(
        project / "src",
        "user_id,item_id,timestamp\n" + "\n".join(rows) + "\n",
        "item_id,title\n" + "\n".join(titles) + "\n",
    )
    settings = csv_settings(
        project,
        inter,
        items,
        dataset="base",
        sasrec=SASREC,
        sids={"method": "rqkmeans", "levels": 2, "codebook_size": 8},
    )
    for stage in (ingest, validate, split):
        stage(settings)
    emb = np.random.default_rng(0).normal(size=(N_ITEMS, 8)).astype(np.float32)
    write_embeddings(settings, emb / np.linalg.norm(emb, axis=1, keepdims=True), ITEM_IDS)
    sids(settings)
    return settings


def test_baselines_saves_sasrec_that_loads_back_and_ranks_as_trained(prepared):
    paths = prepared.paths
    result = baselines(prepared)
    m = json.loads(paths.metrics("baselines").read_text())
    assert m == json.loads(json.dumps(result.metrics))
    assert set(result.outputs) == {
        str(paths.sasrec_model / "model.pt"),
        str(paths.sasrec_model / "config.json"),
        str(paths.metrics("baselines")),
    }
    valid = read_table(paths.split("valid"), SPLIT, "valid split")
    selection = validation_half(valid, "selection")
    assert 0 < m["valid_selection_rows"] == len(selection) < len(valid)  # never the gate half
    assert m["max_len"] == prepared.split.max_history == 20
    assert 1 <= m["best_epoch"] <= m["epochs_run"] <= SASREC["max_epochs"]
    assert m["windows"] > 0 and m["seconds"] >= 0

    loaded = load_baseline(prepared.paths.sasrec_model, item_ids=ITEM_IDS)
    assert loaded.best_epoch == m["best_epoch"] and loaded.config == sasrec_config(prepared)
    assert evaluate_sasrec(loaded, selection)["ndcg@10"] == pytest.approx(
        m["valid_selection"]["ndcg@10"], abs=1e-6
    )
    train = read_table(paths.split("train"), SPLIT, "train split")
    trained = train_sasrec(train, selection, ITEM_IDS, sasrec_config(prepared), progress=False)
    histories = list(valid["history"])
    assert np.array_equal(
        recommend(loaded, histories, N_ITEMS), recommend(trained.model, histories, N_ITEMS)
    )


def test_sasrec_max_len_is_the_split_history_length_unless_set(prepared):
    assert sasrec_config(prepared).max_len == 20
    shorter = prepared.model_copy(
        update={"split": prepared.split.model_copy(update={"max_history": 5})}
    )
    assert sasrec_config(shorter).max_len == 5
    longer = prepared.model_copy(
        update={"sasrec": prepared.sasrec.model_copy(update={"max_len": 50})}
    )
    assert sasrec_config(longer).max_len == 50


def test_a_failed_run_keeps_the_previous_model_and_metrics(prepared, monkeypatch):
    paths = prepared.paths
    baselines(prepared)
    before = {
        p: p.read_bytes() for p in [*paths.sasrec_model.iterdir(), paths.metrics("baselines")]
    }

    def half_then_fail(model, folder):
        (folder / "model.pt").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr("tasks.baselines.save_sasrec", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        baselines(prepared)
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in paths.baselines_dir.iterdir()) == ["sasrec"]  # no staging left


MISSING = r"sasrec: no trained SASRec model .*; run `sidrec baselines` to train it"


def test_grpo_names_the_missing_or_stale_sasrec_model(prepared):
    from tasks.grpo import reward_functions

    assert prepared.grpo.rewards.collaborative > 0
    with pytest.raises(InputError, match=MISSING):
        reward_functions(prepared, ITEM_IDS)
    baselines(prepared)
    reward_functions(prepared, ITEM_IDS)  # loads now
    with pytest.raises(InputError, match=r"trained on another catalog .*run `sidrec baselines`"):
        reward_functions(prepared, [*ITEM_IDS, "i30"])


def test_evaluate_names_the_missing_sasrec_model(prepared):
    from tasks.evaluate import evaluate

    with pytest.raises(InputError, match=MISSING):
        evaluate(prepared)
