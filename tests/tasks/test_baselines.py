"""The baselines stage: SASRec trained once, saved atomically, loaded by grpo and evaluate; EASE's
L2 and the blend's weight chosen on the selection half, or left out past EASE's catalog limit."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from models.baselines import catalog_index, encode_histories, encode_targets
from models.baselines.ease import EASE
from models.baselines.sasrec import load_baseline, recommend, save_sasrec, train_sasrec
from models.metrics import rank_metrics
from sidrec.errors import InputError
from sidrec.io import read_table
from sidrec.protocol import seen_items, validation_half
from sidrec.schemas import SPLIT
from tasks.baselines import baselines, sasrec_config

N_ITEMS, N_USERS = 30, 24
ITEM_IDS = [f"i{n}" for n in range(N_ITEMS)]
SASREC = {"hidden": 16, "heads": 2, "blocks": 1, "max_epochs": 4, "patience": 2}


@pytest.fixture
def split_project(project, csv_settings, synthetic_project):
    """Splits and a SID map of a 30-item catalog where item i is followed by item i + 1."""
    settings = csv_settings(
        project,
        project / "src" / "interactions.csv",
        project / "src" / "items.csv",
        dataset="base",
        sasrec=SASREC,
        sids={"method": "rqkmeans", "levels": 2, "codebook_size": 8},
    )
    replace(synthetic_project, n_items=N_ITEMS, n_users=N_USERS, emb_dim=8).write(settings)
    return settings


def test_baselines_saves_sasrec_that_loads_back_and_ranks_as_trained(split_project):
    paths = split_project.paths
    result = baselines(split_project)
    m = json.loads(paths.metrics("baselines").read_text())
    assert m == json.loads(json.dumps(result.metrics))
    assert set(result.outputs) == {
        str(paths.sasrec_model / "model.pt"),
        str(paths.sasrec_model / "config.json"),
        str(paths.ease_choice),
        str(paths.metrics("baselines")),
    }
    valid = read_table(paths.split("valid"), SPLIT, "valid split")
    selection = validation_half(valid, "selection")
    assert 0 < m["valid_selection_rows"] == len(selection) < len(valid)  # never the gate half
    assert m["max_len"] == split_project.split.max_history == 20
    assert 1 <= m["best_epoch"] <= m["epochs_run"] <= SASREC["max_epochs"]
    assert m["windows"] > 0 and m["seconds"] >= 0 and m["resumed_after_epoch"] == 0
    assert not paths.sasrec_resume.exists()  # the training state goes once the model is stored

    loaded = load_baseline(split_project.paths.sasrec_model, item_ids=ITEM_IDS)
    trained = replace(sasrec_config(split_project), device="cpu")  # loaded on the CPU
    assert loaded.best_epoch == m["best_epoch"] and loaded.config == trained
    # the checkpoint was chosen as evaluate ranks: each user's seen items left out
    assert split_project.evaluate.exclude_seen and m["valid_selection_exclude_seen"]
    train = read_table(paths.split("train"), SPLIT, "train split")
    seen = seen_items(train, selection)
    topk = recommend(loaded, list(selection["history"]), 10, exclude=seen)
    targets = encode_targets(list(selection["target"]), loaded.index, "targets")
    assert rank_metrics(topk, targets, [10])["ndcg@10"] == pytest.approx(
        m["valid_selection"]["ndcg@10"], abs=1e-6
    )
    config = sasrec_config(split_project)
    trained = train_sasrec(train, selection, ITEM_IDS, config, exclude=seen, progress=False)
    histories = list(valid["history"])
    assert np.array_equal(
        recommend(loaded, histories, N_ITEMS), recommend(trained.model, histories, N_ITEMS)
    )


def test_sasrec_max_len_is_the_split_history_length_unless_set(split_project):
    assert sasrec_config(split_project).max_len == 20
    shorter = split_project.model_copy(
        update={"split": split_project.split.model_copy(update={"max_history": 5})}
    )
    assert sasrec_config(shorter).max_len == 5
    longer = split_project.model_copy(
        update={"sasrec": split_project.sasrec.model_copy(update={"max_len": 50})}
    )
    assert sasrec_config(longer).max_len == 50


def test_a_failed_run_keeps_the_previous_model_and_metrics(split_project, monkeypatch):
    paths = split_project.paths
    baselines(split_project)
    before = {
        p: p.read_bytes() for p in [*paths.sasrec_model.iterdir(), paths.metrics("baselines")]
    }

    def half_then_fail(model, folder):
        (folder / "model.pt").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr("tasks.baselines.save_sasrec", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        baselines(split_project)
    assert {p: p.read_bytes() for p in before} == before
    # no staging left; SASRec's finished training state stays for the next try
    names = sorted(p.name for p in paths.baselines_dir.iterdir())
    assert names == ["ease.json", "sasrec", "sasrec-resume.pt"]
    monkeypatch.setattr("tasks.baselines.save_sasrec", save_sasrec)
    calls: list[int] = []
    monkeypatch.setattr(
        "models.baselines.sasrec._train_epoch", lambda *a, **k: calls.append(1) or 0.0
    )
    baselines(split_project)  # goes on from the finished state: no epoch trained again
    assert calls == [] and not paths.sasrec_resume.exists()
    first = json.loads(before[paths.metrics("baselines")])
    now = json.loads(paths.metrics("baselines").read_text())
    assert now["best_epoch"] == first["best_epoch"]
    assert now["resumed_after_epoch"] == first["epochs_run"]  # the whole run was in the file
    assert now["valid_selection"] == first["valid_selection"]


MISSING = r"sasrec: no trained SASRec model .*; run `sidrec baselines` to train it"


def test_grpo_names_the_missing_or_stale_sasrec_model(split_project):
    from tasks.grpo import reward_functions

    assert split_project.grpo.rewards.collaborative > 0
    with pytest.raises(InputError, match=MISSING):
        reward_functions(split_project, ITEM_IDS)
    baselines(split_project)
    reward_functions(split_project, ITEM_IDS)  # loads now
    with pytest.raises(InputError, match=r"trained on another catalog .*run `sidrec baselines`"):
        reward_functions(split_project, [*ITEM_IDS, "i30"])


def test_evaluate_names_the_missing_sasrec_model(split_project):
    from tasks.evaluate import evaluate

    with pytest.raises(InputError, match=MISSING):
        evaluate(split_project)


def test_grpo_fits_its_ease_reward_on_the_train_split(split_project):
    from models.baselines.ease import EASE
    from tasks.grpo import reward_functions
    from tasks.shared.inputs import read_split

    grpo = split_project.grpo.model_copy(
        update={
            "rewards": split_project.grpo.rewards.model_copy(
                update={"collaborative": 0.0, "ease": 0.7}
            ),
            "ease_l2": 20.0,
            "ease_recency": 0.5,
        }
    )
    settings = split_project.model_copy(update={"grpo": grpo})
    rewards, weights = reward_functions(settings, ITEM_IDS)  # no SASRec needed without its reward
    assert [r.__name__ for r in rewards] == ["ranking", "ease"] and weights == [1.0, 0.7]
    model = rewards[1].func.func.model  # NaN guard → group rank → the EASE reward
    assert (model.l2, model.recency) == (20.0, 0.5)
    fitted = EASE(item_ids=ITEM_IDS, l2=20.0).fit(read_split(settings, "train"))
    np.testing.assert_allclose(model.weights, fitted.weights)
    # item i is followed by i + 1 in this catalog: after i3 the reward ranks i4 above i20
    ranked = rewards[1](["x"] * 2, completion_item=[4, 20], history_index=[[2, 3]] * 2)
    assert ranked == [1.0, 0.0]


def _selection_ndcg(scores: np.ndarray, targets: np.ndarray, seen: list[list[int]]) -> float:
    """Mean NDCG@10 of dense ``scores`` with each row's ``seen`` items removed, in numpy."""
    scores = scores.astype(np.float64).copy()
    for row, items in enumerate(seen):
        scores[row, items] = -np.inf
    target = scores[np.arange(len(scores)), targets]
    rank = (scores > target[:, None]).sum(1)  # no ties at the targets on this catalog
    return float(np.where(rank < 10, 1 / np.log2(rank + 2), 0.0).mean())


def test_baselines_choose_ease_l2_and_the_blend_weight_on_the_selection_half(split_project):
    settings = split_project.model_copy(
        update={
            "ease": split_project.ease.model_copy(
                update={
                    "l2_grid": [1.0, 30.0, 3000.0],
                    "l2_edge_steps": 0,  # the grid alone (choose_l2's tests go past it)
                    "blend_alphas": [0.0, 0.5, 4.0],
                }
            )
        }
    )
    paths = settings.paths
    m = baselines(settings).metrics
    choice = json.loads(paths.ease_choice.read_text())
    train = read_table(paths.split("train"), SPLIT, "train split")
    selection = validation_half(read_table(paths.split("valid"), SPLIT, "valid"), "selection")
    index = catalog_index(ITEM_IDS)
    histories = encode_histories(list(selection["history"]), index)
    targets = encode_targets(list(selection["target"]), index)
    seen = encode_histories(seen_items(train, selection), index)
    # every L2 scored by the closed form and numpy alone; the best one kept
    expected = {}
    for l2 in (1.0, 30.0, 3000.0):
        model = EASE(item_ids=ITEM_IDS, l2=l2, recency=0.9).fit(train)
        expected[f"{l2:g}"] = _selection_ndcg(
            model.inputs(histories) @ model.weights, targets, seen
        )
    assert m["ease"]["l2_grid"] == pytest.approx(expected, abs=1e-6)
    best = max(expected, key=expected.__getitem__)
    assert choice["l2"] == m["ease"]["l2"] == float(best)
    assert m["ease"]["valid_selection"]["ndcg@10"] == pytest.approx(expected[best], abs=1e-6)
    assert (choice["recency"], choice["left_out"]) == (0.9, None)
    # the blend's α: the best of its grid (α 0 is SASRec's own ranking, its checkpoint's score)
    grid = m["blend"]["alpha_grid"]
    assert list(grid) == ["0", "0.5", "4"]
    assert grid["0"] == pytest.approx(m["valid_selection"]["ndcg@10"], abs=1e-6)
    assert choice["alpha"] == m["blend"]["alpha"] == float(max(grid, key=grid.__getitem__))
    assert m["blend"]["valid_selection"]["ndcg@10"] == max(grid.values())


def test_past_the_catalog_limit_ease_and_the_blend_are_left_out(split_project, monkeypatch):
    monkeypatch.setattr("models.baselines.ease.MAX_ITEMS", N_ITEMS - 1)
    result = baselines(split_project)  # SASRec trains; no crash
    reason = (
        f"the catalog has {N_ITEMS} items, above EASE's limit of {N_ITEMS - 1} (it inverts a "
        "dense items × items matrix), so the ease and blend rows are left out"
    )
    assert json.loads(split_project.paths.ease_choice.read_text()) == {
        "l2": None,
        "recency": None,
        "alpha": None,
        "left_out": reason,
    }
    assert result.metrics["ease"] == result.metrics["blend"] == {"left_out": reason}
    assert result.metrics["best_epoch"] >= 1 and "EASE and blend left out" in result.summary


def test_the_teachers_still_refuse_ease_past_its_limit(split_project, monkeypatch):
    """Where a teacher needs EASE, past its limit is a configuration error (the baselines stage
    leaves its rows out instead)."""
    from sidrec.errors import ConfigError
    from tasks.shared.inputs import check_teacher_ease

    monkeypatch.setattr("models.baselines.ease.MAX_ITEMS", N_ITEMS - 1)
    teacher = split_project.model_copy(
        update={"sft": split_project.sft.model_copy(update={"distill_ease": 0.5})}
    )
    with pytest.raises(ConfigError, match=r"sft.distill_ease is 0.5 but the catalog has 30 items"):
        check_teacher_ease(teacher, N_ITEMS)
    with pytest.raises(ConfigError, match=r"grpo.anchor_ease is 0.25 but the catalog"):
        check_teacher_ease(split_project, N_ITEMS)  # GRPO's anchor blends EASE in
    no_teacher = split_project.model_copy(
        update={"sft": split_project.sft.model_copy(update={"distill": 0.0})}
    )
    check_teacher_ease(no_teacher, N_ITEMS)
