"""SFT objectives: sequence windows (every train interaction a target) and per-row prompts; the
prompt format a model was trained with travels with it; validation keeps the best epoch."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from models.lm import load_model_dir
from models.prompts import prompt_format
from sidrec.errors import ConfigError
from tasks.sft import build_datasets, check_window
from tasks.shared.inputs import (
    item_texts,
    load_catalog_and_map,
    load_recommender,
    sequence_windows,
    without_recent_rows,
)


def _train(sequences: dict[str, list[str]], max_history: int = 3) -> pd.DataFrame:
    """Train rows as the split writes them: one per target, histories capped."""
    rows = [
        (user, items[max(0, k - max_history) : k], items[k], 1_600_000_000 + k)
        for user, items in sequences.items()
        for k in range(1, len(items))
    ]
    return pd.DataFrame(rows, columns=["user_id", "history", "target", "timestamp"])


def test_windows_hold_every_interaction_once_newest_first():
    sequences = {"u1": [f"a{k}" for k in range(12)], "u2": ["b0", "b1", "b2"]}
    windows = sequence_windows(_train(sequences), window=5)
    assert windows == [
        ["a7", "a8", "a9", "a10", "a11"],  # the newest items make a full window
        ["a2", "a3", "a4", "a5", "a6"],
        ["a0", "a1"],
        ["b0", "b1", "b2"],
    ]
    flat = [i for w in windows for i in w]
    assert sorted(flat) == sorted(i for s in sequences.values() for i in s)
    assert sequence_windows(_train(sequences), window=5, stride=5) == windows


def test_overlapping_windows_stop_at_the_first_that_reaches_the_oldest_item():
    sequences = {"u1": [f"a{k}" for k in range(12)], "u2": ["b0", "b1", "b2"]}
    windows = sequence_windows(_train(sequences), window=5, stride=3)
    assert windows == [
        ["a7", "a8", "a9", "a10", "a11"],
        ["a4", "a5", "a6", "a7", "a8"],
        ["a1", "a2", "a3", "a4", "a5"],
        ["a0", "a1", "a2"],  # reaches a0: u1's last window
        ["b0", "b1", "b2"],
    ]


def test_holding_out_recent_rows_cuts_each_users_newest_items_and_keeps_one_row():
    sequences = {"u1": [f"a{k}" for k in range(6)], "u2": ["b0", "b1", "b2"], "u3": ["c0", "c1"]}
    train = _train(sequences)
    kept = without_recent_rows(train, 2)
    # u1 loses targets a4, a5; u2 (2 rows) and u3 (1 row) keep their oldest row
    assert sorted(kept["target"]) == ["a1", "a2", "a3", "b1", "c1"]
    assert sequence_windows(kept, window=10) == [
        ["a0", "a1", "a2", "a3"],
        ["b0", "b1"],
        ["c0", "c1"],
    ]
    assert without_recent_rows(train, 0) is train


class _Recorder:
    """A prompt builder that hands back what it was asked to build."""

    def sequence_example(self, window):
        return ("window", tuple(window))

    def history_example(self, history, target, by_title):
        return ("row", tuple(history), target)


def test_sft_trains_without_the_held_out_rows(make_settings, project):
    train = _train({"u1": [f"a{k}" for k in range(6)]})
    valid = pd.DataFrame(
        {"user_id": ["u1"], "history": [["a3", "a4", "a5"]], "target": ["a6"], "timestamp": [9]}
    )
    settings = make_settings(project, sft={"holdout_recent": 2, "tasks": ["seq_rec"]})
    examples, _ = build_datasets(settings, _Recorder(), train, valid)
    assert examples == [("window", ("a0", "a1", "a2", "a3"))]
    rows = make_settings(
        project,
        sft={"holdout_recent": 2, "tasks": ["seq_rec"], "objective": "rows", "distill": 0},
        grpo={"sft_anchor": 0},
    )
    examples, _ = build_datasets(rows, _Recorder(), train, valid)
    assert [e[2] for e in examples] == ["a1", "a2", "a3"]


def test_the_alignment_pairs_carry_the_item_text(make_settings, project):
    """GRPO's title prompts read the same builder texts (tasks/grpo.py, ``title_rows``)."""
    from models.lm import add_sid_tokens, train_tokenizer
    from models.prompts import PromptBuilder, sid2title_prompt, title2sid_prompt

    items = pd.DataFrame(
        {"item_id": ["1", "2"], "title": ["Heat", "Fargo"], "year": ["1995", None]}
        | {"genres": ["Action, Crime", "Crime"]}
    )
    default = make_settings(project)
    assert item_texts(default, items) == {"1": "Heat", "2": "Fargo"}  # the title alone
    settings = make_settings(project, sft={"item_text": "{title} ({year}): {genres}"})
    texts = item_texts(settings, items)
    assert texts == {"1": "Heat (1995): Action, Crime", "2": "Fargo (): Crime"}
    sid_map = {"1": [0, 1], "2": [1, 0]}
    tokenizer = train_tokenizer([*texts.values(), title2sid_prompt("")] * 5, 300)
    add_sid_tokens(tokenizer, 2, 2)
    builder = PromptBuilder(tokenizer=tokenizer, sid_map=sid_map, titles=texts, max_length=64)
    assert builder.alignment_examples("sid2title") == [
        (sid2title_prompt([0, 1]), " Heat (1995): Action, Crime"),
        (sid2title_prompt([1, 0]), " Fargo (): Crime"),
    ]
    assert [e.prompt for e in builder.alignment_examples("title2sid")] == [
        title2sid_prompt("Heat (1995): Action, Crime"),
        title2sid_prompt("Fargo (): Crime"),
    ]
    bad = make_settings(project, sft={"item_text": "{title} by {director}"})
    with pytest.raises(ConfigError, match=r"sft.item_text uses field\(s\) \['director'\]"):
        item_texts(bad, items)


def test_a_window_longer_than_the_context_is_a_config_error(make_settings, project):
    settings = make_settings(project, sft={"window": 70}, model={"max_length": 256})
    with pytest.raises(ConfigError, match=r"sft.window=70 .* 281 tokens.*model.max_length=256"):
        check_window(settings, levels=3)
    check_window(
        settings.model_copy(update={"sft": settings.sft.model_copy(update={"window": 63})}), 3
    )
    rows = make_settings(
        project, sft={"window": 70, "objective": "rows", "distill": 0}, grpo={"sft_anchor": 0}
    )
    check_window(rows, levels=3)  # the rows objective has no windows


def test_ease_in_a_teacher_is_refused_above_the_catalog_ease_inverts(make_settings, project):
    from tasks.shared.inputs import check_teacher_ease

    # by default GRPO's anchor blends EASE in: refused before SFT trains, naming the key
    settings = make_settings(project)
    check_teacher_ease(settings, 30_000)
    with pytest.raises(ConfigError, match=r"grpo.anchor_ease is 0.25 .* 30001 items.*: 0"):
        check_teacher_ease(settings, 30_001)
    sft = make_settings(project, sft={"distill_ease": 0.5}, grpo={"anchor_ease": 0.0})
    with pytest.raises(ConfigError, match=r"sft.distill_ease is 0.5 .* 30001 items"):
        check_teacher_ease(sft, 30_001)
    # no EASE where it would act: any catalog
    for off in (
        make_settings(project, grpo={"anchor_ease": 0.0}),
        make_settings(project, grpo={"sft_anchor": 0.0}),
        make_settings(project, grpo={"enabled": False}),
        make_settings(project, sft={"distill": 0.0}),
    ):
        check_teacher_ease(off, 30_001)


@pytest.mark.parametrize("key", ["distill", "corrupt_items", "drop_items"])
def test_sequence_only_keys_need_sequence_windows(make_settings, project, key):
    from tasks.shared.inputs import sasrec_teacher

    # refused when the settings load, before a tokenizer or model is built
    with pytest.raises(ConfigError, match=rf"{key}=0.5 act on sequence windows.*sft.{key}=0"):
        make_settings(project, sft={"objective": "rows", "distill": 0, key: 0.5})
    off = make_settings(project, sft={"objective": "rows", "distill": 0.0}, grpo={"sft_anchor": 0})
    assert sasrec_teacher(off, None, {}, []) is None  # SASRec is not read


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["sequence", "rows"])
def test_the_objective_sets_the_format_every_loader_uses(prepared, synthetic_project, objective):
    from tasks.evaluate import evaluate
    from tasks.sft import sft

    settings = synthetic_project.settings(
        prepared.paths.data_dir.parent,
        sft={
            "objective": objective,
            "epochs": 4,
            "eval_every": 2,
            "batch_size": 4 if objective == "sequence" else 32,  # 15 or 10 steps an epoch
            "tasks": ["seq_rec"],
            # the window augmentations are wired in (rows has no windows: refused there)
            "corrupt_items": 0.1 if objective == "sequence" else 0.0,
            "drop_items": 0.1 if objective == "sequence" else 0.0,
            # sequence: SASRec's soft targets join the loss (the baselines stage's model)
            "distill": 0.5 if objective == "sequence" else 0.0,
        },
    )
    result = sft(settings)
    m = result.metrics
    augmented = 0.1 if objective == "sequence" else 0.0
    assert (m["corrupt_items"], m["drop_items"]) == (augmented, augmented)
    assert m["distill"] == (0.5 if objective == "sequence" else 0.0)
    # what reached the trainer: both augmentations, and the teacher's term in the logged loss
    sequence = objective == "sequence"
    assert m["augmentations"] == (["ItemCorruption", "ItemDeletion"] if sequence else [])
    assert (m["distill_loss_last"] is not None and m["distill_loss_last"] > 0) is sequence
    expected_format = "sequence" if objective == "sequence" else "text"
    model, _ = load_model_dir(settings.paths.sft_model)
    assert prompt_format(model) == expected_format
    # 60 users x 6 train items: one window each, or one example per train row (5 per user)
    assert m["train_examples"] == (60 if objective == "sequence" else 300)
    assert (m["objective"], m["window"]) == (objective, 8 if objective == "sequence" else None)
    assert [r["epoch"] for r in m["valid_history"]] == [2.0, 4.0]
    best = max(m["valid_history"], key=lambda r: r["ndcg@10"])
    assert m["best_epoch"] == best["epoch"] and m["valid_best"]["ndcg@10"] == best["ndcg@10"]
    assert 0 < m["valid_users"] < 60  # the selection half of the validation users
    assert not (settings.paths.sft_dir / ".best").exists()

    report = evaluate(settings).metrics
    assert report["test"]["sft"]["invalid_rate"] == 0.0
    items, sid_map = load_catalog_and_map(settings)
    loaded = load_recommender(
        settings, settings.paths.sft_model, sid_map, items["item_id"].tolist(), missing_hint=""
    )
    assert loaded.prompts.format == expected_format  # evaluate, grpo, the gate and pyfunc
    assert json.loads(settings.paths.metrics("sft").read_text())["objective"] == objective


@pytest.mark.slow
def test_validating_more_often_does_not_change_what_training_learns(prepared, synthetic_project):
    """Validations only read the model (beam search draws no random numbers): a run validated
    every epoch and one validated at its end train the same weights, so the last validation
    of one is the other's, digit for digit. (A checkpoint rule can then be judged from one run's
    validations.)"""
    from tasks.sft import sft

    def run(eval_every: int) -> dict:
        settings = synthetic_project.settings(
            prepared.paths.data_dir.parent,
            sft={"epochs": 3, "eval_every": eval_every, "batch_size": 4, "tasks": ["seq_rec"]},
        )
        return sft(settings).metrics

    often, once = run(1), run(3)
    assert [r["epoch"] for r in often["valid_history"]] == [1.0, 2.0, 3.0]
    assert [r["epoch"] for r in once["valid_history"]] == [3.0]
    assert often["train_loss"] == once["train_loss"]
    assert often["valid_history"][-1] == once["valid_history"][-1]
