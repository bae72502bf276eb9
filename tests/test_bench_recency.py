"""bench.recency: the test rows scored with and without their last history item, by the synthetic
project's trained SASRec and SFT models (item i is followed by i + 1 there, so the last item
decides the next); and the settings of a run folder it reads with ``--run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common import RUN_RECORD, run_settings
from bench.recency import recency
from sidrec.config import Settings
from sidrec.errors import InputError
from tasks.evaluate import evaluate
from tasks.shared.inputs import read_split


def test_the_full_histories_score_as_evaluate_and_the_cut_ones_lose(trained: Settings) -> None:
    evaluate(trained)
    report = json.loads(trained.paths.metrics("eval").read_text())
    result = recency(trained)
    assert result.rows == len(read_split(trained, "test"))
    assert set(result.ndcg10) == {"sasrec", "sft"}  # the synthetic project runs no GRPO
    for model, (full, _) in result.ndcg10.items():
        assert full == pytest.approx(report["test"][model]["ndcg@10"], abs=5e-7)  # 6 digits
    full, cut = result.ndcg10["sft"]
    # without its last item the model predicts that item (seen, so excluded), not the target
    assert cut < full / 2


def test_a_run_folder_gives_its_own_settings_and_overrides_come_last(tmp_path: Path) -> None:
    run = tmp_path / "seed-5"
    run.mkdir()
    with pytest.raises(InputError, match="did not finish"):
        run_settings(run)
    (run / RUN_RECORD).write_text(json.dumps({"overrides": ["project.seed=5", "sft.epochs=3"]}))
    settings = run_settings(run, ["sft.epochs=4"])
    assert (settings.project.seed, settings.sft.epochs) == (5, 4)
    assert settings.paths.sft_model.is_relative_to(run)
    with pytest.raises(InputError, match="not found"):
        run_settings(tmp_path / "elsewhere")
