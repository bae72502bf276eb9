"""bench/checkpoints.py: which validation early stopping would have kept, and the clear error
for a folder the pipeline has not run in (nothing trains here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.checkpoints import kept_by_patience, main
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
