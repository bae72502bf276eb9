"""bench.checkpoint_rules: the kept and the last validation of bench.checkpoints folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.checkpoint_rules import SCORES, table
from sidrec.errors import InputError


def _folder(root: Path, name: str, kept: int, gate: list[list[float]], test: list[list[float]]):
    folder = root / name
    folder.mkdir()
    record = {
        "epochs": [2.0 * (i + 1) for i in range(len(gate))],
        "selection": [0.1] * len(gate),
        "kept": kept,
        "gate": [{"ndcg@10": sum(g) / len(g), "per_user_ndcg@10": g} for g in gate],
        "test": [{"ndcg@10": sum(t) / len(t), "per_user_ndcg@10": t} for t in test],
    }
    (folder / SCORES).write_text(json.dumps(record))
    return folder


def test_the_kept_and_the_last_validation_per_folder_and_pooled(tmp_path: Path) -> None:
    # seed a kept epoch 2 of 3 validations; seed b kept its last, so its rules agree
    a = _folder(tmp_path, "a", 1, [[0, 0], [1, 0], [1, 1]], [[0, 0], [0, 1], [0, 0]])
    b = _folder(tmp_path, "b", 2, [[0, 0], [0, 0], [1, 0]], [[0, 0], [0, 0], [1, 1]])
    lines = table([a, b], resamples=200)
    assert lines[0].startswith("| folder | epoch kept / last | gate best | gate last |")
    # a: gate 0.5 -> 1.0 (+0.5), test 0.5 -> 0.0 (-0.5); kept epoch 4 of 6
    assert lines[2].startswith(f"| {a} | 4 / 6 | 0.5000 | 1.0000 | +0.5000 [")
    assert "| 0.5000 | 0.0000 | -0.5000 [" in lines[2]
    # b: both rules the same model: a difference of exactly 0
    assert lines[3] == (
        f"| {b} | 6 / 6 | 0.5000 | 0.5000 | +0.0000 [+0.0000, +0.0000] "
        "| 1.0000 | 1.0000 | +0.0000 [+0.0000, +0.0000] |"
    )
    # pooled: each user's mean over the folders; gate 0.5 -> 0.75, test 0.75 -> 0.5
    assert lines[4].startswith("| pooled (2) | | 0.5000 | 0.7500 | +0.2500 [")
    assert "| 0.7500 | 0.5000 | -0.2500 [" in lines[4]


def test_folders_of_other_users_or_without_scores_are_refused(tmp_path: Path) -> None:
    a = _folder(tmp_path, "a", 0, [[0, 1]], [[0, 1]])
    b = _folder(tmp_path, "b", 0, [[0, 1, 1]], [[0, 1]])
    with pytest.raises(InputError, match=r"different gate users \(\[2, 3\] rows\)"):
        table([a, b], resamples=100)
    with pytest.raises(InputError, match="run `python -m bench.checkpoints --out` there"):
        table([tmp_path / "missing"], resamples=100)
