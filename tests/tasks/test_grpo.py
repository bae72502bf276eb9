"""The grpo stage on the synthetic catalog (tests/conftest.py: item i is followed by i+1)."""

from __future__ import annotations

import json

import pytest

from models.lm import load_model_dir
from models.sid import read_sid_map
from sidrec.errors import ConfigError, InputError
from tasks.evaluate import evaluate
from tasks.grpo import grpo

GRPO = {
    "enabled": True,
    "num_generations": 4,
    "prompts_per_step": 4,
    "max_steps": 4,
    "eval_every": 2,
    "eval_users": 8,
    "log_samples_every": 2,
    "sample_rows": 2,
    "learning_rate": 0.001,
}


def _with_grpo(synthetic_project, settings):
    def make(**grpo_extra):
        return synthetic_project.settings(
            settings.paths.data_dir.parent, grpo={**GRPO, **grpo_extra}
        )

    return make


@pytest.fixture
def grpo_settings(prepared, synthetic_project):
    """``grpo_settings(**grpo)``: the prepared project's settings with GRPO on."""
    return _with_grpo(synthetic_project, prepared)


@pytest.fixture
def grpo_trained(trained, synthetic_project):
    """``grpo_trained(**grpo)``: the same, with the SFT model trained."""
    return _with_grpo(synthetic_project, trained)


@pytest.mark.slow
def test_grpo_trains_keeps_the_best_model_and_evaluate_reports_it(grpo_trained):
    settings = grpo_trained(rewards={"ranking": 1.0, "semantic": 0.5, "collaborative": 0.0})
    tables = []
    result = grpo(settings, on_samples=lambda step, rows: tables.append((step, rows)))
    m = json.loads(settings.paths.metrics("grpo").read_text())
    assert m == json.loads(json.dumps(result.metrics))
    assert m["steps"] == 4 and m["rollout"] == "beam"
    assert [r["step"] for r in m["valid_history"]] == [0, 2, 4]  # SFT start, then every 2 steps
    best = max(m["valid_history"], key=lambda r: r["ndcg@10"])
    assert m["valid_best"]["ndcg@10"] == best["ndcg@10"] and m["best_step"] == best["step"]
    # the kept step travels inside the model folder (evaluate reads it there)
    kept_step = json.loads(settings.paths.grpo_kept_step.read_text())
    assert kept_step == {"best_step": best["step"]}
    assert m["distinct_items_per_group"] == 1.0 and m["non_finite_rewards"] == 0
    assert set(m["rewards"]) == {"ranking", "semantic"}
    # per logging step: the target's presence in the groups, and each reward's mean
    assert [r["step"] for r in m["rollout_history"]] == [1, 2, 3, 4]
    for row in m["rollout_history"]:
        assert 0.0 <= row["target_in_group"] <= 1.0
        assert {"rewards/ranking/mean", "rewards/semantic/mean"} <= set(row)
        assert "target_rank" not in row or 1 <= row["target_rank"] <= 4
    # the run's share is the mean of the logging steps' shares
    shares = [row["target_in_group"] for row in m["rollout_history"]]
    assert m["target_in_group"] == pytest.approx(sum(shares) / len(shares), abs=1e-5)
    assert [step for step, _ in tables] == [0, 2]
    _, rows = tables[0]
    assert len(rows) == 2 * 4 and {"target", "completion", "rank", "ranking", "semantic"} <= set(
        rows[0]
    )
    _, tokenizer = load_model_dir(settings.paths.grpo_model)
    assert tokenizer.convert_tokens_to_ids("<a_0>") != tokenizer.unk_token_id
    assert not (settings.paths.grpo_dir / ".best").exists()

    report = evaluate(settings).metrics
    for split_name in ("valid", "test"):
        assert set(report[split_name]) == {"popularity", "sasrec", "ease", "blend", "sft", "grpo"}
        assert report[split_name]["grpo"]["invalid_rate"] == 0.0


def test_more_generations_than_items_is_a_config_error_before_training(
    grpo_settings, synthetic_project
):
    n_items = synthetic_project.n_items
    settings = grpo_settings(num_generations=n_items + 1)
    with pytest.raises(
        ConfigError,
        match=rf"num_generations \({n_items + 1}\) exceeds the catalog \({n_items} items\)",
    ):
        grpo(settings)
    assert not settings.paths.grpo_dir.exists()


def test_vllm_rollouts_on_a_cpu_machine_are_a_config_error(grpo_settings):
    settings = grpo_settings(use_vllm=True, rollout="sample")
    with pytest.raises(ConfigError, match="grpo.use_vllm needs a CUDA GPU"):
        grpo(settings)


def test_a_switched_off_stage_refuses_and_says_what_dvc_needs(grpo_settings):
    settings = grpo_settings(enabled=False)
    with pytest.raises(ConfigError, match=r"grpo.enabled is false.*`dvc repro` cannot"):
        grpo(settings)
    assert not settings.paths.grpo_dir.exists()


def test_grpo_needs_the_sft_model(grpo_settings):
    with pytest.raises(InputError, match="model folder not found"):
        grpo(grpo_settings())


@pytest.mark.slow
def test_an_interrupted_run_leaves_no_best_model_copy(grpo_trained, monkeypatch):
    from models.grpo_trainer import SidGRPOTrainer

    settings = grpo_trained()
    best_dir = settings.paths.grpo_dir / ".best"

    def interrupted(self, *args, **kwargs):
        self.callback_handler.on_train_begin(self.args, self.state, self.control)  # step 0 kept
        assert (best_dir / "config.json").exists()
        raise KeyboardInterrupt

    monkeypatch.setattr(SidGRPOTrainer, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grpo(settings)
    assert not best_dir.exists() and not settings.paths.grpo_model.exists()
    assert not settings.paths.metrics("grpo").exists()


@pytest.mark.slow
def test_an_sft_model_that_does_not_match_the_sid_map_is_rejected(grpo_trained):
    settings = grpo_trained()
    sid_map = read_sid_map(settings.paths.sid_map)
    sid_map["i0"] = [7, 99]  # <b_99> was never added to the SFT tokenizer
    settings.paths.sid_map.write_text(json.dumps(sid_map))
    with pytest.raises(InputError, match="does not match the model's tokenizer"):
        grpo(settings)
    assert not settings.paths.grpo_model.exists() and not settings.paths.metrics("grpo").exists()


@pytest.mark.slow
def test_evaluate_names_the_missing_grpo_model(grpo_trained):
    settings = grpo_trained()
    with pytest.raises(InputError, match=r"run `sidrec grpo` first, or set grpo.enabled false"):
        evaluate(settings)


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_training_prompts_carry_what_the_user_had_before_under_exclude_seen(
    grpo_settings, synthetic_project, exclude_seen
):
    from types import SimpleNamespace

    from models.baselines import catalog_index
    from sidrec.protocol import items_before
    from tasks.grpo import training_rows
    from tasks.shared.inputs import read_split, recent_rows

    settings = grpo_settings()
    settings = synthetic_project.settings(
        settings.paths.data_dir.parent,
        grpo={**GRPO, "rows_per_user": 2},
        evaluate={"exclude_seen": exclude_seen},
    )
    train = read_split(settings, "train")
    index = catalog_index(sorted({*train["target"], *(i for h in train["history"] for i in h)}))
    builder = SimpleNamespace(history_prompt=lambda history: " ".join(history))
    rows = training_rows(settings, builder, train, index)  # type: ignore[arg-type]
    recent = recent_rows(train, 2)
    assert [r["target_index"] for r in rows] == [index[t] for t in recent["target"]]
    if not exclude_seen:
        assert all("exclude_index" not in r for r in rows)
        return
    before = items_before(train, recent)
    assert [r["exclude_index"] for r in rows] == [[index[i] for i in b] for b in before]
    for row, target in zip(rows, recent["target"], strict=True):
        assert index[target] not in row["exclude_index"]  # the synthetic users never repeat
        assert set(row["history_index"]) <= set(row["exclude_index"])


def test_with_a_horizon_each_prompt_counts_the_users_next_train_items_as_right(
    grpo_settings, synthetic_project
):
    from types import SimpleNamespace

    from models.baselines import catalog_index
    from sidrec.protocol import items_after
    from tasks.grpo import training_rows
    from tasks.shared.inputs import read_split, recent_rows

    settings = grpo_settings()
    train = read_split(settings, "train")
    index = catalog_index(sorted({*train["target"], *(i for h in train["history"] for i in h)}))
    builder = SimpleNamespace(history_prompt=lambda history: " ".join(history))

    def rows_with(horizon: int) -> list[dict]:
        s = synthetic_project.settings(
            settings.paths.data_dir.parent,
            grpo={
                **GRPO,
                "rows_per_user": 3,
                "horizon": horizon,
                "frontier_prompts": True,
                "rewards": {"ranking": 1.0, "collaborative": 0.5},
            },
        )
        return training_rows(s, builder, train, index)  # type: ignore[arg-type]

    assert all("positive_index" not in r for r in rows_with(1))  # today's rows, unchanged
    rows = rows_with(3)
    recent = recent_rows(train, 3)
    history_rows, frontier = rows[: len(recent)], rows[len(recent) :]
    after = items_after(train, recent, 3)
    assert [r["positive_index"] for r in history_rows] == [[index[i] for i in a] for a in after]
    assert all(r["positive_index"][0] == r["target_index"] for r in history_rows)
    # a user's oldest of the three rows has two later train items, the newest none
    assert {len(r["positive_index"]) for r in history_rows} == {1, 2, 3}
    assert all(r["positive_index"] == [] for r in frontier)  # no target, nothing right


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_frontier_prompts_ask_where_the_valid_rows_ask_without_a_target(
    grpo_settings, synthetic_project, exclude_seen
):
    from types import SimpleNamespace

    from models.baselines import catalog_index
    from models.rewards import NO_TARGET
    from sidrec.protocol import seen_items
    from tasks.grpo import training_rows
    from tasks.shared.inputs import read_split

    settings = grpo_settings()

    def rows_with(per_user: int) -> list[dict]:
        s = synthetic_project.settings(
            settings.paths.data_dir.parent,
            grpo={**GRPO, "rows_per_user": per_user, "frontier_prompts": True},
            evaluate={"exclude_seen": exclude_seen},
        )
        return training_rows(s, builder, train, index)  # type: ignore[arg-type]

    train, valid = read_split(settings, "train"), read_split(settings, "valid")
    index = catalog_index(sorted({*train["target"], *(i for h in train["history"] for i in h)}))
    builder = SimpleNamespace(history_prompt=lambda history: " ".join(history))
    rows = rows_with(0)
    # one prompt per user: the valid row's history (the split's own cut), no target
    asked = [[index[i] for i in h] for h in valid["history"]]
    assert len(rows) == train["user_id"].nunique() == valid["user_id"].nunique() == len(asked)
    assert sorted(r["history_index"] for r in rows) == sorted(asked)
    assert all(r["target_index"] == NO_TARGET for r in rows)
    if exclude_seen:  # what evaluation of the valid rows leaves out
        seen = [sorted(index[i] for i in s) for s in seen_items(train, valid)]
        assert sorted(r["exclude_index"] for r in rows) == sorted(seen)
    else:
        assert all("exclude_index" not in r for r in rows)
    with_recent = rows_with(2)
    assert with_recent[-len(rows) :] == rows  # added after the recent rows' prompts
    assert all(r["target_index"] != NO_TARGET for r in with_recent[: -len(rows)])


def test_grpo_prompt_settings_that_leave_a_group_unscorable_or_no_prompts_are_config_errors(
    grpo_settings,
):
    from tasks.grpo import check_grpo_config

    settings = grpo_settings(
        frontier_prompts=True, rewards={"rule": 0.0, "ranking": 1.0, "collaborative": 0.0}
    )
    with pytest.raises(ConfigError, match=r"grpo.frontier_prompts.*grpo.rewards.collaborative"):
        check_grpo_config(settings, n_items=100)
    with pytest.raises(ConfigError, match=r"grpo.rows_per_user is 0 .*no training prompts"):
        check_grpo_config(grpo_settings(rows_per_user=0), n_items=100)
    check_grpo_config(grpo_settings(rows_per_user=0, frontier_prompts=True), n_items=100)
    ease = grpo_settings(rewards={"ranking": 1.0, "ease": 0.5})
    check_grpo_config(ease, n_items=30_000)
    with pytest.raises(ConfigError, match=r"grpo.rewards.ease is 0.5 .* 30001 items.*ease: 0"):
        check_grpo_config(ease, n_items=30_001)
    taught = grpo_settings(anchor_ease=0.25, sft_anchor=1.0)
    check_grpo_config(taught, n_items=30_000)
    with pytest.raises(ConfigError, match=r"grpo.anchor_ease is 0.25 .* 30001 items"):
        check_grpo_config(taught, n_items=30_001)


def test_the_sft_anchor_replays_the_train_windows_and_needs_the_sequence_objective(
    grpo_settings, synthetic_project, monkeypatch
):
    from models.baselines import sasrec as sasrec_module
    from models.lm import add_sid_tokens, train_tokenizer
    from models.prompts import PromptBuilder
    from models.sid import sid_tokens
    from tasks.grpo import check_grpo_config, reward_functions, sft_anchor
    from tasks.sft import sid_shape
    from tasks.shared.inputs import (
        load_catalog_and_map,
        read_split,
        sasrec_loader,
        sequence_windows,
        without_recent_rows,
    )

    settings = grpo_settings(sft_anchor=0.5, anchor_windows=3, rows_per_user=1)
    check_grpo_config(settings, n_items=100)
    items, sid_map = load_catalog_and_map(settings)
    catalog = items["item_id"].tolist()
    train = read_split(settings, "train")
    tokenizer = train_tokenizer(["The user interacted with"] * 5, 300)
    add_sid_tokens(tokenizer, *sid_shape(sid_map, settings.sids.codebook_size))
    builder = PromptBuilder(
        tokenizer=tokenizer,
        sid_map=sid_map,
        titles=dict(zip(items["item_id"], items["title"], strict=True)),
        max_length=settings.model.max_length,
        fmt="sequence",
    )
    assert (
        sft_anchor(grpo_settings(sft_anchor=0), builder, tokenizer, train, sid_map, catalog) is None
    )
    anchor = sft_anchor(settings, builder, tokenizer, train, sid_map, catalog)
    assert anchor is not None and (anchor.weight, anchor.per_step) == (0.5, 3)
    # scored with SFT's loss: SASRec's soft targets at SFT's weight and temperature
    assert settings.sft.distill > 0
    assert (anchor.teacher.weight, anchor.teacher.temperature) == (
        settings.sft.distill,
        settings.sft.distill_temperature,
    )
    assert anchor.teacher.targets(anchor.batch())  # the windows' items, found in its batches
    # the GRPO stage reads SASRec once for the collaborative reward and the anchor's teacher
    reads = []
    read = sasrec_module.load_sasrec
    monkeypatch.setattr(
        sasrec_module, "load_sasrec", lambda *a, **k: reads.append(a) or read(*a, **k)
    )
    shared = sasrec_loader(settings, catalog)
    rewards, _ = reward_functions(settings, catalog, shared)
    collaborative = {reward.__name__: reward for reward in rewards}["collaborative"]
    assert settings.grpo.reward_form == "rank"  # NaN guard → group rank → SASRec's reward
    shared_anchor = sft_anchor(settings, builder, tokenizer, train, sid_map, catalog, shared)
    assert shared_anchor is not None and shared_anchor.teacher is not None
    assert collaborative.func.func.model is shared_anchor.teacher.sasrec is shared()
    assert len(reads) == 1
    # EASE joins the anchor's teacher at grpo.anchor_ease (0.25 by default), fitted on the
    # train split; null: SFT's own teacher (sft.distill_ease, 0 by default: SASRec alone)
    assert settings.grpo.anchor_ease == 0.25 and anchor.teacher.ease_weight == 0.25
    assert anchor.teacher.ease.item_ids == [str(i) for i in catalog]
    assert anchor.teacher.ease.weights.any()
    as_sft = synthetic_project.settings(
        settings.paths.data_dir.parent, grpo={**GRPO, "sft_anchor": 0.5, "anchor_ease": None}
    )
    as_sft_anchor = sft_anchor(as_sft, builder, tokenizer, train, sid_map, catalog)
    assert as_sft_anchor is not None and as_sft_anchor.teacher.ease is None
    # without SFT's teacher the anchor is the token loss alone (grpo.anchor_ease has no teacher)
    untaught = synthetic_project.settings(
        settings.paths.data_dir.parent, grpo={**GRPO, "sft_anchor": 0.5}, sft={"distill": 0.0}
    )
    untaught_anchor = sft_anchor(untaught, builder, tokenizer, train, sid_map, catalog)
    assert untaught_anchor is not None and untaught_anchor.teacher is None
    # every train interaction, in its window (the SFT windows, not GRPO's one row per user)
    item_of = {tuple(tokenizer.convert_tokens_to_ids(sid_tokens(c))): i for i, c in sid_map.items()}
    levels = len(next(iter(sid_map.values())))
    replayed = []
    for ids, labels in anchor.rows:
        completion = [t for t, label in zip(ids, labels, strict=True) if label != -100]
        assert completion[levels :: levels + 1] == [tokenizer.eos_token_id] * (
            len(completion) // (levels + 1)
        )
        items_ = [completion[k : k + levels] for k in range(0, len(completion), levels + 1)]
        replayed.append([item_of[tuple(t)] for t in items_])
    assert sorted(replayed) == sorted(sequence_windows(train, settings.sft.window))
    assert sum(map(len, replayed)) == len(train) + train["user_id"].nunique()
    # with SFT's held-out rows (sft.holdout_recent) the anchor leaves them out as SFT did
    held_out = synthetic_project.settings(
        settings.paths.data_dir.parent,
        grpo={**GRPO, "sft_anchor": 0.5},
        sft={"holdout_recent": 1},
    )
    anchor = sft_anchor(held_out, builder, tokenizer, train, sid_map, catalog)
    assert anchor is not None
    kept = sequence_windows(without_recent_rows(train, 1), held_out.sft.window)
    targets = sum(label != -100 for _, labels in anchor.rows for label in labels)
    assert targets == sum(map(len, kept)) * (levels + 1)  # each item's SID and EOS
    assert sum(map(len, kept)) < sum(map(len, replayed))

    with pytest.raises(ConfigError, match=r"grpo.sft_anchor is 0.5 but sft.objective is 'rows'"):
        synthetic_project.settings(
            settings.paths.data_dir.parent,
            grpo={**GRPO, "sft_anchor": 0.5},
            sft={"objective": "rows", "distill": 0},
        )


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_title_prompts_take_their_share_of_the_training_prompts(
    grpo_settings, synthetic_project, exclude_seen
):
    from types import SimpleNamespace

    from models.baselines import catalog_index
    from models.prompts import title2sid_prompt
    from tasks.grpo import training_rows
    from tasks.shared.inputs import read_split

    settings = grpo_settings()
    train = read_split(settings, "train")
    items = sorted({*train["target"], *(i for h in train["history"] for i in h)})
    index = catalog_index(items)
    titles = {item: f"Title of {item}" for item in items}
    builder = SimpleNamespace(
        history_prompt=lambda history: " ".join(history),
        titles=titles,
        title_prompt=lambda item: title2sid_prompt(titles[item]),
    )

    def rows_with(share: float, seed: int = 0) -> list[dict]:
        s = synthetic_project.settings(
            settings.paths.data_dir.parent,
            grpo={**GRPO, "rows_per_user": 2, "title_prompts": share},
            evaluate={"exclude_seen": exclude_seen},
            project={"seed": seed},
        )
        return training_rows(s, builder, train, index)  # type: ignore[arg-type]

    plain = rows_with(0.0)
    mixed = rows_with(0.5)
    assert mixed[: len(plain)] == plain  # the history prompts are untouched
    titled = mixed[len(plain) :]
    assert len(titled) == len(plain)  # a share of 0.5: as many title prompts as history prompts
    by_prompt = {title2sid_prompt(t): index[i] for i, t in titles.items()}
    assert all(by_prompt[r["prompt"]] == r["target_index"] for r in titled)
    assert all(r["history_index"] == [] for r in titled)
    assert all(r.get("exclude_index") == [] for r in titled) is exclude_seen
    # each item once before any repeats, in an order the seed fixes
    firsts = [r["target_index"] for r in titled[: len(items)]]
    assert len(set(firsts)) == len(firsts)
    assert rows_with(0.5) == mixed and rows_with(0.5, seed=1) != mixed
    assert len(rows_with(0.25)) - len(plain) == round(len(plain) / 3)


@pytest.mark.slow
def test_with_a_moving_average_the_judged_average_is_the_model_kept(grpo_trained, monkeypatch):
    import torch

    from models import weight_average

    judged: list[dict[str, torch.Tensor]] = []
    applied = weight_average.WeightAverage.applied

    def record(self, model):
        judged.append({n: p.detach().clone() for n, p in model.named_parameters()})
        return applied(self, model)

    monkeypatch.setattr(weight_average.WeightAverage, "applied", record)
    settings = grpo_trained(ema_decay=0.5, max_steps=4, eval_every=2)
    m = grpo(settings).metrics
    assert [r["step"] for r in m["valid_history"]] == [0, 2, 4] and len(judged) == 3
    live = judged[m["valid_history"].index(max(m["valid_history"], key=lambda r: r["ndcg@10"]))]
    kept, _ = load_model_dir(settings.paths.grpo_model)
    # `record` saw the live weights as each validation began; the kept model is an average,
    # so it differs from the live weights of any step after the first
    if m["best_step"] > 0:
        assert any(not torch.allclose(p, live[n]) for n, p in kept.named_parameters())
    else:
        for n, p in kept.named_parameters():
            torch.testing.assert_close(p, live[n])  # step 0: the average is the SFT model


def test_the_rollout_log_keeps_a_reward_that_scored_nothing_as_none():
    from tasks.grpo import rollout_log

    entry = {
        "step": 10,
        "rollout/target_in_group": 0.25,
        "rewards/ranking/mean": None,  # TRL's nanmean of a step without a target
        "rewards/collaborative/mean": 0.512345678,
        "rewards/collaborative/std": 0.3,
        "loss": 0.1,
    }
    assert rollout_log(entry) == {
        "step": 10,
        "target_in_group": 0.25,
        "rewards/ranking/mean": None,
        "rewards/collaborative/mean": 0.51235,
    }
