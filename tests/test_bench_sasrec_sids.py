"""bench.sasrec_sids: SIDs whose collaborative half is SASRec's item embedding table (the factors
on the synthetic project's SASRec; the copy's stages faked: which run with the swap in place and
what is recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bench.common
import bench.sasrec_sids
from bench.common import RUN_RECORD, StagesRun, ensure_run, folder_settings
from bench.sasrec_sids import sasrec_factors, sasrec_sids
from models.baselines.sasrec import load_sasrec
from sidrec.config import Settings
from sidrec.io import read_table
from sidrec.schemas import ITEMS
from sidrec.stage import Stage
from tasks.shared import embeddings


def test_the_factors_are_sasrecs_item_rows_at_unit_length(
    prepared: Settings, synthetic_project
) -> None:
    # the synthetic catalog's 60 users allow an SVD of rank 16, not the default 64
    prepared = synthetic_project.settings(Path.cwd(), sids={"collaborative_dim": 16})
    items = read_table(prepared.paths.validated("items"), ITEMS, "validated items")
    catalog = items["item_id"].tolist()
    svd = embeddings.collaborative_factors(prepared, items, None)
    factors = sasrec_factors(prepared, items, None)
    model = load_sasrec(prepared.paths.sasrec_model, item_ids=catalog)
    table = model.item_emb.weight[1:].detach().numpy()
    np.testing.assert_array_equal(factors.without_interactions, svd.without_interactions)
    kept = ~factors.without_interactions
    assert kept.any()
    expected = table[kept] / np.linalg.norm(table[kept], axis=1, keepdims=True)
    np.testing.assert_allclose(factors.factors[kept], expected, rtol=1e-6)
    assert factors.factors.shape == (len(catalog), model.config.hidden) != svd.factors.shape


def test_only_the_sids_stage_runs_with_the_swap_and_sasrec_is_the_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def source_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        (work / "metrics").mkdir(parents=True, exist_ok=True)
        seconds: dict[Stage, float] = {
            "split": 1.0,
            "sids": 4.0,
            "baselines": 9.0,
            "sft": 5.0,
            "evaluate": 1.0,
        }
        return StagesRun(folder_settings(work, overrides), {}, seconds)

    monkeypatch.setattr(bench.common, "run_stages", source_run)
    source = tmp_path / "runs" / "seed-3"
    ensure_run(source, ["project.seed=3"], "evaluate")
    ran: list[tuple[str, str, bool]] = []

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        assert overrides == ["project.seed=3"]
        swapped = embeddings.collaborative_factors is sasrec_factors
        ran.append((start, until, swapped))
        seconds: dict[Stage, float] = (
            {"sids": 2.0} if start == "sids" else {"sft": 6.0, "evaluate": 2.0}
        )
        return StagesRun(folder_settings(work, overrides), {}, seconds)

    monkeypatch.setattr(bench.sasrec_sids, "run_stages", fake_run)
    copy = tmp_path / "sasrec-sids" / "seed-3"
    sasrec_sids(source, copy)
    assert ran == [("sids", "sids", True), ("sft", "evaluate", False)]  # SASRec not retrained
    record = json.loads((copy / RUN_RECORD).read_text())
    assert record["seconds"] == {
        "split": 1.0,
        "sids": 2.0,
        "baselines": 9.0,
        "sft": 6.0,
        "evaluate": 2.0,
    }
    assert record["prepared_on"]["until"] == "embed"
    with pytest.raises(Exception, match="exists already"):  # never overwritten
        sasrec_sids(source, copy)
