"""bench.grpo: every rollout mode trains a copy of the project's SFT model, with the default
GRPO (its anchor reads SASRec, which the bench copies too), and the table reports each."""

from __future__ import annotations

import sys

import pytest

from sidrec.config import Settings


def test_the_bench_times_every_rollout_with_the_default_anchor(
    trained: Settings, synthetic_project, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from bench import grpo as bench_grpo

    assert trained.grpo.sft_anchor > 0 and trained.paths.sasrec_model.is_dir()
    # GRPO on, groups the synthetic catalog holds; the bench sets the steps and validations
    sets = synthetic_project.overrides(
        grpo={"enabled": True, "num_generations": 4, "prompts_per_step": 4, "eval_users": None}
    )
    argv = ["bench.grpo", "--threads", "1", "--steps", "2"]
    monkeypatch.setattr(sys, "argv", argv + [a for o in sets for a in ("--set", o)])
    bench_grpo.main()
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]  # no header
    assert [row.split(" | ")[0] for row in rows] == ["| beam", "| sample", "| dynamic"]
    assert rows[1].endswith("| 1.00× |")  # sample is the reference
