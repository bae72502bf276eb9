"""Popularity and SASRec baselines on tiny hand-made splits (each test takes a few seconds at most)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from models.baselines import encode_histories, train_sequences
from models.baselines import sasrec as sasrec_module
from models.baselines.popularity import Popularity
from models.baselines.sasrec import (
    SASRec,
    SASRecConfig,
    SASRecTrainResult,
    _pack,
    _windows,
    evaluate_sasrec,
    load_sasrec,
    recommend,
    save_sasrec,
    train_sasrec,
)

N_ITEMS = 20
ITEMS = [f"i{i}" for i in range(N_ITEMS)]
SplitRows = Callable[[dict[str, list[str]], int], dict[str, pd.DataFrame]]
"""The ``split_rows`` fixture (tests/models/conftest.py)."""


def successor_splits(
    split_rows: SplitRows, users: int = 40, length: int = 12, seed: int = 0
) -> dict[str, pd.DataFrame]:
    """Item i is always followed by item i + 1 (mod N_ITEMS); users start anywhere."""
    starts = np.random.default_rng(seed).integers(0, N_ITEMS, users)
    seqs = {
        f"u{u}": [ITEMS[(s + t) % N_ITEMS] for t in range(length)] for u, s in enumerate(starts)
    }
    return split_rows(seqs, max_history=5)


def tiny_config(**overrides: object) -> SASRecConfig:
    base: dict[str, object] = dict(
        hidden=32, blocks=1, heads=2, dropout=0.0, max_len=8, lr=1e-2, batch_size=32,
        max_epochs=40, patience=3,
    )  # fmt: skip
    return SASRecConfig(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def splits(split_rows: SplitRows) -> dict[str, pd.DataFrame]:
    return successor_splits(split_rows)


@pytest.fixture(scope="module")
def trained(splits: dict[str, pd.DataFrame]) -> SASRecTrainResult:
    return train_sasrec(splits["train"], splits["valid"], ITEMS, tiny_config(), progress=False)


# --- shared data preparation


def test_train_sequences_rebuild_capped_histories_and_never_invent_transitions(
    split_rows: SplitRows,
) -> None:
    rows = split_rows({"a": list("pqrst"), "b": list("xyz")}, max_history=2)["train"]
    assert train_sequences(rows) == [list("pqr")]  # b's rows are all valid / test
    broken = pd.DataFrame(
        {
            "user_id": ["a", "a", "a"],
            "history": [["p"], ["p", "q"], ["z"]],  # the third row does not continue p q r
            "target": ["q", "r", "w"],
            "timestamp": [1, 2, 3],
        }
    )
    assert train_sequences(broken) == [["p", "q", "r"], ["z", "w"]]


def test_train_sequences_rebuild_long_sequence_from_capped_rows(split_rows: SplitRows) -> None:
    rows = split_rows({"a": list("abcdefgh")}, max_history=2)["train"]
    assert rows["history"].str.len().max() == 2
    assert train_sequences(rows) == [list("abcdef")]  # g is valid, h is test


def test_encode_histories_names_row_of_unknown_item() -> None:
    index = {item: i for i, item in enumerate(ITEMS)}
    assert encode_histories([["i3", "i1"], [2]], index) == [[3, 1], [2]]
    with pytest.raises(ValueError, match="row 1 holds item 'nope'"):
        encode_histories([["i1"], ["i2", "nope"]], index)
    with pytest.raises(ValueError, match="row 0 holds item 20"):
        encode_histories([[20]], index)


# --- popularity


def test_popularity_counts_each_training_interaction_once(split_rows: SplitRows) -> None:
    train = split_rows({"a": ["x", "y", "z", "q", "q2"], "b": ["y", "z", "w", "q", "q2"]}, 20)[
        "train"
    ]
    pop = Popularity(item_ids=["w", "x", "y", "z", "v"]).fit(train)
    assert pop.counts.tolist() == [1, 1, 2, 2, 0]  # sequences x y z and y z w
    assert pop.ranking.tolist() == [2, 3, 0, 1, 4]  # ties broken by catalog order
    assert pop.recommend(2, 3).tolist() == [[2, 3, 0], [2, 3, 0]]
    assert pop.recommend(1, 7).tolist() == [[2, 3, 0, 1, 4, -1, -1]]


def test_popularity_rejects_unknown_items_and_empty_train(split_rows: SplitRows) -> None:
    train = split_rows({"a": ["x", "y", "z", "q", "r"]}, 20)["train"]
    with pytest.raises(ValueError, match="not in the catalog"):
        Popularity(item_ids=["x", "y"]).fit(train)
    with pytest.raises(ValueError, match="train split is empty"):
        Popularity(item_ids=["x"]).fit(train.iloc[:0])
    with pytest.raises(ValueError, match="more than once"):
        Popularity(item_ids=["x", "x"])


# --- SASRec


def test_sasrec_learns_successor_pattern(
    trained: SASRecTrainResult, splits: dict[str, pd.DataFrame]
) -> None:
    test = evaluate_sasrec(trained.model, splits["test"], name="test")
    assert test["ndcg@10"] > 0.95
    assert test["hr@1"] > 0.9
    assert trained.best_valid_ndcg10 == pytest.approx(
        evaluate_sasrec(trained.model, splits["valid"])["ndcg@10"]
    )  # the restored checkpoint is the best one


def test_sasrec_early_stops_patience_epochs_after_best(trained: SASRecTrainResult) -> None:
    epochs_run = trained.history[-1]["epoch"]
    assert epochs_run < tiny_config().max_epochs
    assert epochs_run == trained.best_epoch + tiny_config().patience
    assert [r["epoch"] for r in trained.history] == list(range(1, int(epochs_run) + 1))
    best = max(trained.history, key=lambda r: r["ndcg@10"])
    assert best["epoch"] == trained.best_epoch


def test_sasrec_training_changes_every_parameter(splits: dict[str, pd.DataFrame]) -> None:
    config = tiny_config(max_epochs=2)
    torch.manual_seed(config.seed)  # train_sasrec builds its model right after the same seeding
    initial = {k: v.clone() for k, v in SASRec(item_ids=ITEMS, config=config).state_dict().items()}
    result = train_sasrec(splits["train"], splits["valid"], ITEMS, config, progress=False)
    changed = {k: not torch.equal(v, initial[k]) for k, v in result.model.state_dict().items()}
    assert all(changed.values()), [k for k, c in changed.items() if not c]
    again = train_sasrec(splits["train"], splits["valid"], ITEMS, config, progress=False)
    assert again.history == result.history  # seeded: the same run twice


def test_a_cosine_schedule_falls_from_lr_towards_zero_over_max_epochs_and_constant_stays(
    splits: dict[str, pd.DataFrame],
) -> None:
    config = tiny_config(max_epochs=4, patience=10, lr_schedule="cosine")
    cosine = train_sasrec(splits["train"], splits["valid"], ITEMS, config, progress=False)
    assert cosine.windows > config.batch_size  # several steps an epoch
    expected = [0.5 * (1 + np.cos(np.pi * e / 4)) * config.lr for e in range(4)]
    assert [r["lr"] for r in cosine.history] == pytest.approx(expected)
    constant = train_sasrec(
        splits["train"], splits["valid"], ITEMS, tiny_config(max_epochs=4), progress=False
    )
    assert [r["lr"] for r in constant.history] == [config.lr] * 4
    assert cosine.history[-1]["loss"] != constant.history[-1]["loss"]  # the rate was applied


TRAIN_EPOCH = sasrec_module._train_epoch


class StopAfter:
    """``_train_epoch`` that raises KeyboardInterrupt (a killed run) when asked for epoch
    ``stop`` of this run, and counts the epochs it trained."""

    def __init__(self, stop: int | None = None) -> None:
        self.stop, self.epochs = stop, 0

    def __call__(self, *args: object, **kwargs: object) -> float:
        if self.epochs + 1 == self.stop:
            raise KeyboardInterrupt
        self.epochs += 1
        return TRAIN_EPOCH(*args, **kwargs)  # type: ignore[arg-type]


def same_weights(a: SASRec, b: SASRec) -> bool:
    return all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


RESUMABLE = dict(max_epochs=6, patience=10, dropout=0.3, lr_schedule="cosine")
"""Dropout and a schedule: a resumed run matches only where their states were restored."""


def test_a_stopped_run_resumes_after_its_last_epoch_and_ends_as_an_uninterrupted_one(
    splits: dict[str, pd.DataFrame], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(**RESUMABLE)
    whole = train_sasrec(splits["train"], splits["valid"], ITEMS, config, progress=False)
    file = tmp_path / "state" / "resume.pt"
    killed = StopAfter(stop=4)
    monkeypatch.setattr(sasrec_module, "_train_epoch", killed)
    with pytest.raises(KeyboardInterrupt):
        train_sasrec(splits["train"], splits["valid"], ITEMS, config, progress=False, resume=file)
    assert killed.epochs == 3 and file.exists()
    assert [p.name for p in file.parent.iterdir()] == ["resume.pt"]  # no staging left
    resumed = StopAfter()
    monkeypatch.setattr(sasrec_module, "_train_epoch", resumed)
    again = train_sasrec(
        splits["train"], splits["valid"], ITEMS, config, progress=False, resume=file
    )
    assert resumed.epochs == 3 and again.resumed_after == 3  # epochs 4..6 only
    assert whole.resumed_after == 0
    assert again.history == whole.history and again.best_epoch == whole.best_epoch
    assert same_weights(again.model, whole.model)
    # the file now holds a finished run: resuming it trains nothing and returns its best
    finished = StopAfter()
    monkeypatch.setattr(sasrec_module, "_train_epoch", finished)
    last = train_sasrec(
        splits["train"], splits["valid"], ITEMS, config, progress=False, resume=file
    )
    assert finished.epochs == 0 and last.history == whole.history
    assert same_weights(last.model, whole.model)


def test_a_resume_file_of_another_run_or_unreadable_is_replaced_by_a_fresh_run(
    splits: dict[str, pd.DataFrame], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tiny_config(**{**RESUMABLE, "max_epochs": 3})
    whole = train_sasrec(splits["train"], splits["valid"], ITEMS, config, progress=False)
    file = tmp_path / "resume.pt"
    other = tiny_config(**{**RESUMABLE, "max_epochs": 3, "lr": 5e-3})
    train_sasrec(splits["train"], splits["valid"], ITEMS, other, progress=False, resume=file)
    fresh = train_sasrec(
        splits["train"], splits["valid"], ITEMS, config, progress=False, resume=file
    )
    assert f"{file} holds a run of other settings or data" in caplog.text
    assert fresh.history == whole.history
    # the same settings on other data (the valid rows cut) is another run too
    caplog.clear()
    train_sasrec(splits["train"], splits["valid"][1:], ITEMS, config, progress=False, resume=file)
    assert "other settings or data" in caplog.text
    file.write_bytes(b"not a checkpoint")
    again = train_sasrec(
        splits["train"], splits["valid"], ITEMS, config, progress=False, resume=file
    )
    assert f"{file} cannot be read" in caplog.text
    assert again.history == whole.history and file.stat().st_size > 100


def test_sasrec_validates_with_the_given_exclusions(splits: dict[str, pd.DataFrame]) -> None:
    # excluding every validation target leaves nothing to hit: the exclusion reaches the
    # metric the checkpoint is chosen on
    valid = splits["valid"]
    targets = [[t] for t in valid["target"]]
    config = tiny_config(max_epochs=2)
    result = train_sasrec(splits["train"], valid, ITEMS, config, exclude=targets, progress=False)
    assert [r["ndcg@10"] for r in result.history] == [0.0, 0.0]


def test_recommend_returns_distinct_catalog_items(
    trained: SASRecTrainResult, splits: dict[str, pd.DataFrame]
) -> None:
    histories = list(splits["test"]["history"])
    top = recommend(trained.model, histories, 10)
    assert top.shape == (len(histories), 10) and top.dtype == np.int64
    assert all(len(set(row)) == 10 for row in top.tolist())
    assert top.min() >= 0 and top.max() < N_ITEMS
    full = recommend(trained.model, histories[:3], N_ITEMS)
    assert all(sorted(row) == list(range(N_ITEMS)) for row in full.tolist())
    as_indices = [[int(i[1:]) for i in h] for h in histories]
    assert np.array_equal(recommend(trained.model, as_indices, 10), top)


def test_recommend_excludes_the_given_items_per_row(trained: SASRecTrainResult) -> None:
    histories = [["i1", "i2", "i3"], ["i7"]]
    seen = [["i1", "i2", "i3", "i9"], ["i7"]]  # the whole seen set, beyond the history window
    top = recommend(trained.model, histories, N_ITEMS, exclude=seen)
    assert set(top[0, :-4].tolist()).isdisjoint({1, 2, 3, 9}) and top[0, -4:].tolist() == [-1] * 4
    assert 7 not in top[1].tolist() and (top[1, :-1] >= 0).all()
    # exclusion removes items only: the others keep their order
    plain = recommend(trained.model, histories, N_ITEMS)
    assert top[0, :-4].tolist() == [i for i in plain[0].tolist() if i not in {1, 2, 3, 9}]


def test_left_padding_does_not_change_a_rows_scores(trained: SASRecTrainResult) -> None:
    short, long = ["i4", "i5"], ["i10", "i11", "i12", "i13", "i14", "i15"]
    alone = recommend(trained.model, [short], N_ITEMS)
    batched = recommend(trained.model, [long, short, []], N_ITEMS)
    assert np.array_equal(batched[1:2], alone)
    assert (batched[2] >= 0).all()  # an empty history still gets a (finite) ranking


def test_a_packed_batch_has_the_loss_and_gradients_of_its_windows_apart() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, N_ITEMS, n).tolist() for n in (2, 3, 5, 9, 14, 4, 7, 2)]
    inputs, targets = _windows(sequences, max_len=6)
    packed = _pack(inputs, targets)
    assert len(packed.inputs) < len(inputs)
    assert sorted(packed.targets[packed.targets >= 0].tolist()) == sorted(
        targets[targets >= 0].tolist()
    )
    model = SASRec(item_ids=ITEMS, config=SASRecConfig(max_len=6, hidden=8, heads=2)).eval()

    def loss_and_grads(x, y, *extra):
        model.zero_grad()
        keep = y >= 0
        loss = torch.nn.functional.cross_entropy(model.scores(model(x, *extra)[keep]), y[keep])
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters()]

    loss, grads = loss_and_grads(inputs, targets)
    packed_loss, packed_grads = loss_and_grads(
        packed.inputs, packed.targets, packed.positions, packed.segments
    )
    assert packed_loss == pytest.approx(loss, rel=1e-6)
    for grad, packed_grad in zip(grads, packed_grads, strict=True):
        torch.testing.assert_close(packed_grad, grad, rtol=1e-5, atol=1e-6)


def test_recommend_rejects_unknown_items(trained: SASRecTrainResult) -> None:
    with pytest.raises(ValueError, match="histories row 1 holds item 'unknown'"):
        recommend(trained.model, [["i1"], ["i2", "unknown"]], 5)


def test_train_sasrec_rejects_bad_input(splits: dict[str, pd.DataFrame]) -> None:
    train, valid = splits["train"], splits["valid"]
    with pytest.raises(ValueError, match="train split is empty"):
        train_sasrec(train.iloc[:0], valid, ITEMS, tiny_config(), progress=False)
    with pytest.raises(ValueError, match="valid split is empty"):
        train_sasrec(train, valid.iloc[:0], ITEMS, tiny_config(), progress=False)
    with pytest.raises(ValueError, match="not in the catalog"):
        train_sasrec(train, valid, ITEMS[:10], tiny_config(), progress=False)
    with pytest.raises(ValueError, match="lacks columns"):
        train_sasrec(train.drop(columns="history"), valid, ITEMS, tiny_config(), progress=False)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"heads": 3}, "heads must be a divisor of hidden"),
        ({"dropout": 1.0}, "dropout"),
        ({"lr_schedule": "linear"}, "lr_schedule must be one of"),
    ],
)
def test_sasrec_config_rejects_bad_values(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)


# --- saving and loading


def test_saved_sasrec_loads_back_and_recommends_identically(
    trained: SASRecTrainResult, splits: dict[str, pd.DataFrame], tmp_path: Path
) -> None:
    save_sasrec(trained.model, tmp_path / "sasrec")
    assert sorted(p.name for p in (tmp_path / "sasrec").iterdir()) == ["config.json", "model.pt"]
    loaded = load_sasrec(tmp_path / "sasrec", item_ids=ITEMS)
    assert loaded.config == trained.model.config and loaded.item_ids == ITEMS
    assert loaded.best_epoch == trained.best_epoch and not loaded.training
    original = trained.model.state_dict()
    assert all(torch.equal(v, original[k]) for k, v in loaded.state_dict().items())
    histories = list(splits["test"]["history"])
    assert np.array_equal(
        recommend(loaded, histories, N_ITEMS), recommend(trained.model, histories, N_ITEMS)
    )
    save_sasrec(loaded, tmp_path / "again")  # the same model saves to the same bytes
    for name in ("config.json", "model.pt"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "sasrec" / name).read_bytes()


def test_load_sasrec_names_the_folder_and_what_is_wrong(
    trained: SASRecTrainResult, tmp_path: Path
) -> None:
    folder = tmp_path / "sasrec"
    with pytest.raises(ValueError, match=r"sasrec: no trained SASRec model \(model.pt, config"):
        load_sasrec(folder, item_ids=ITEMS)
    save_sasrec(trained.model, folder)
    with pytest.raises(
        ValueError, match=r"sasrec: the SASRec model was trained on another catalog"
    ):
        load_sasrec(folder, item_ids=[*ITEMS, "i20"])
    with pytest.raises(
        ValueError, match=r"20 items there, 20 now; row 0 holds 'i0' there, 'i1' now"
    ):
        load_sasrec(folder, item_ids=[ITEMS[1], ITEMS[0], *ITEMS[2:]])
    (folder / "model.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"model.pt: cannot load the SASRec weights"):
        load_sasrec(folder, item_ids=ITEMS)
