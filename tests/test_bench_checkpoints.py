"""bench/checkpoints.py: which validation early stopping would have kept, the run record
`--evaluate` writes, and the clear error for a folder the pipeline has not run in (nothing trains
here: the stages are faked)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import bench.checkpoints
from bench.checkpoints import evaluate_and_record, kept_by_patience, main
from bench.common import RUN_RECORD, StagesRun, folder_settings, run_record
from sidrec.errors import InputError


@pytest.mark.parametrize(
    ("selection", "patience", "kept"),
    [
        ([0.1, 0.2, 0.3], 2, 2),  # still rising at the end
        ([0.1, 0.3, 0.2, 0.25, 0.4], 2, 1),  # stopped after two without a gain: 0.4 unseen
        ([0.1, 0.3, 0.2, 0.25, 0.4], 3, 4),
        ([0.1, 0.3, 0.2, 0.25, 0.4], None, 4),  # never stops: the best overall
        ([0.3, 0.3, 0.3], 1, 0),  # a tie is no gain
    ],
)
def test_kept_by_patience_follows_early_stopping(selection, patience, kept) -> None:
    assert kept_by_patience(selection, patience) == kept


def test_a_folder_without_a_run_is_refused_before_anything_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    (run / "data").mkdir(parents=True)
    argv = ["checkpoints", "--run", str(run), "--out", str(out), "--seed", "0", "--threads", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(InputError, match="not a finished run folder") as err:
        main()
    assert "baselines" in str(err.value)
    assert not out.exists()


def test_evaluate_writes_the_record_quality_reads_with_the_prepared_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--evaluate`: evaluate runs without GRPO, and the run record joins the copied folder's
    stages before SFT (their seconds and machine) with this run's SFT and evaluate seconds."""
    ran: list[tuple[list[str], str, str]] = []

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        ran.append((list(overrides), start, until))
        assert not (work / RUN_RECORD).exists()  # unfinished while it runs
        return StagesRun(folder_settings(work, overrides), {}, {"evaluate": 2.0})

    monkeypatch.setattr(bench.checkpoints, "run_stages", fake_run)
    source = {
        "until": "baselines",
        "seconds": {"split": 1.0, "baselines": 60.0},
        "machine": {"cpu": "elsewhere"},
    }
    out = tmp_path / "w" / "default" / "seed-4"
    out.mkdir(parents=True)
    overrides = ["project.seed=4", "sft.dropout=0.1"]
    evaluate_and_record(out, overrides, {"sft": 300.0}, source)
    assert ran == [([*overrides, "grpo.enabled=false"], "evaluate", "evaluate")]
    record = run_record(out, "unused")
    assert record["seed"] == 4 and record["until"] == "evaluate"
    assert record["overrides"] == [*overrides, "grpo.enabled=false"]
    assert record["seconds"] == {"split": 1.0, "baselines": 60.0, "sft": 300.0, "evaluate": 2.0}
    assert record["prepared_on"] == {"until": "baselines", "machine": {"cpu": "elsewhere"}}
    evaluate_and_record(out, overrides, {"sft": 300.0}, None)  # a `make run` folder: no record
    again = run_record(out, "unused")
    assert "prepared_on" not in again and again["seconds"] == {"sft": 300.0, "evaluate": 2.0}
