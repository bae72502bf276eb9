"""SasrecTeacher: SASRec's item distribution as per-SID-place soft targets, and the loss it adds."""

from __future__ import annotations

import pytest
import torch

from models.baselines.ease import EASE, blend
from models.baselines.sasrec import SASRec, SASRecConfig
from models.distill import SasrecTeacher

BOS, EOS = 1, 2
CATALOG = torch.tensor([[10, 20, 30], [10, 21, 31], [11, 20, 32], [11, 22, 33]])
"""Four items' SID token ids: items 0 and 1 share the first code 10, items 2 and 3 share 11;
items 0 and 2 share the second-level token 20 under different prefixes."""
VOCAB = 40


def _sasrec() -> SASRec:
    torch.manual_seed(0)
    return SASRec(item_ids=["a", "b", "c", "d"], config=SASRecConfig(max_len=5)).eval()


def _window(items: list[int], masked: int | None = None) -> dict[str, torch.Tensor]:
    ids = [BOS, *(t for i in items for t in [*CATALOG[i].tolist(), EOS])]
    labels = [-100, *ids[1:]]
    if masked is not None:  # an item that is not a target (e.g. corrupted)
        start = 1 + 4 * masked
        labels[start : start + 3] = [-100] * 3
    return {
        "input_ids": torch.tensor([ids]),
        "labels": torch.tensor([labels]),
        "position_ids": torch.arange(len(ids))[None],
    }


def _item_probs(sasrec: SASRec, history: list[int]) -> torch.Tensor:
    """SASRec's softmax over the catalog after ``history``, the history's items removed."""
    with torch.no_grad():
        scores = sasrec.scores(sasrec(torch.tensor([[i + 1 for i in history]]))[0, -1])
    scores[history] = float("-inf")
    return scores.softmax(-1)


def test_targets_are_sasrecs_item_mass_per_code_given_the_true_prefix():
    sasrec = _sasrec()
    teacher = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0)
    levels = teacher.targets(_window([0, 2, 1]))
    assert [t.tokens.tolist() for t in levels] == [[10, 11], [20, 21, 22], [30, 31, 32, 33]]
    # items 2 (after [0]) and 1 (after [0, 2]) have history; item 0 has none: 2 places x 3 levels
    got = {
        (int(r), int(c)): torch.zeros(VOCAB).index_copy(0, t.tokens, p)
        for t in levels
        for r, c, p in zip(t.rows, t.columns, t.probs, strict=True)
    }
    assert sorted(got) == [(0, c) for c in (4, 5, 6, 8, 9, 10)]
    assert all(torch.isclose(p.sum(), torch.tensor(1.0)) for p in got.values())
    p = _item_probs(sasrec, [0])  # item 2's place: the window's item 0 came before it
    assert p[0] == 0
    torch.testing.assert_close(got[(0, 4)][[10, 11]], torch.stack([p[1], p[2] + p[3]]))
    # given the true first code 11: items 2 and 3, by their second code
    torch.testing.assert_close(got[(0, 5)][[20, 22]], torch.stack([p[2], p[3]]) / (p[2] + p[3]))
    assert got[(0, 6)][32] == 1  # given 11, 20 only item 2 remains
    q = _item_probs(sasrec, [0, 2])  # item 1's place
    torch.testing.assert_close(got[(0, 8)][[10, 11]], torch.stack([q[1], q[3]]))
    assert got[(0, 9)][21] == 1 and got[(0, 10)][31] == 1  # item 0, seen, takes no mass
    # nothing outside the SID tokens of each place
    assert got[(0, 4)][[10, 11]].sum() == pytest.approx(1.0)


def test_a_future_share_moves_mass_onto_the_target_and_the_windows_next_items():
    sasrec = _sasrec()
    plain = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0)
    teacher = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0, future=0.4, horizon=2)
    batch = _window([0, 2, 1, 3])
    first = {
        int(c): p
        for c, p in zip(
            teacher.targets(batch)[0].columns, teacher.targets(batch)[0].probs, strict=True
        )
    }
    p = _item_probs(sasrec, [0])  # item 2's place: its burst is items 2 and 1
    mixed = 0.6 * p + 0.4 * torch.tensor([0.0, 0.5, 0.5, 0.0])
    torch.testing.assert_close(first[4], torch.stack([mixed[0] + mixed[1], mixed[2] + mixed[3]]))
    q = _item_probs(sasrec, [0, 2, 1])  # item 3's place: the window ends, item 3 alone
    mixed = 0.6 * q + 0.4 * torch.tensor([0.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(first[12], torch.stack([mixed[0] + mixed[1], mixed[2] + mixed[3]]))
    # the same places as without the share; the deeper levels keep the true prefix
    for a, b in zip(teacher.targets(batch), plain.targets(batch), strict=True):
        assert torch.equal(a.columns, b.columns)
        torch.testing.assert_close(a.probs.sum(-1), torch.ones(len(a.probs)))


def test_items_that_are_not_targets_and_windows_without_history_get_no_targets():
    teacher = SasrecTeacher(_sasrec(), CATALOG, bos_token_id=BOS, weight=1.0)
    assert teacher.targets(_window([3])) == []
    levels = teacher.targets(_window([0, 2, 1], masked=1))
    assert [t.columns.tolist() for t in levels] == [[8], [9], [10]]
    # an alignment pair (text before the SID) is never a window
    pair = {
        "input_ids": torch.tensor([[BOS, 5, 6, *CATALOG[0].tolist()]]),
        "labels": torch.tensor([[-100, -100, -100, *CATALOG[0].tolist()]]),
        "position_ids": torch.arange(6)[None],
    }
    assert teacher.targets(pair) == []


def _rows(*windows: dict[str, torch.Tensor], width: int = 0):
    """Windows as the rows of one batch, right-padded to the longest (or ``width``) with no
    labels and position 0, as the packed rows' collator pads them."""
    width = max(width, *(w["input_ids"].shape[1] for w in windows))
    pad = {"input_ids": 0, "labels": -100, "position_ids": 0}
    return {
        key: torch.cat(
            [
                torch.nn.functional.pad(w[key], (0, width - w[key].shape[1]), value=value)
                for w in windows
            ]
        )
        for key, value in pad.items()
    }


def test_a_rows_places_are_read_once_and_reused_in_any_batch():
    """The packed rows come back every epoch in other batches, padded to other widths: each
    row's places are kept, and a batch of kept rows gets exactly the targets a fresh teacher
    computes."""
    sasrec = _sasrec()
    a, b = _window([0, 2, 1]), _window([3, 1, 0, 2])
    teacher = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0)
    teacher.targets(_rows(a, b))
    assert len(teacher._rows_cache) == 2
    reads = []
    teacher._row_places = lambda *args: (
        reads.append(args) or SasrecTeacher._row_places(teacher, *args)
    )
    swapped = _rows(b, a, width=25)  # the same rows, in the other order, padded further
    fresh = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0).targets(swapped)
    kept = teacher.targets(swapped)
    assert reads == []  # every row was known
    for x, y in zip(kept, fresh, strict=True):
        for name in ("rows", "columns", "tokens", "probs"):
            assert torch.equal(getattr(x, name), getattr(y, name))
    assert sorted(kept[0].rows.tolist()) == [0, 0, 0, 1, 1]  # b's 3 places are row 0 now
    assert teacher.targets(_rows(a, width=30))[0].columns.tolist() == [4, 8]


def test_the_least_recently_used_rows_leave_a_full_cache():
    sasrec = _sasrec()
    a, b, c = _window([0, 2, 1]), _window([3, 1, 0, 2]), _window([1, 3])
    teacher = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0, cached_rows=2)
    teacher.targets(_rows(a, b))
    teacher.targets(_rows(a))  # a is now the most recently used
    expected = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0).targets(_rows(c, b))
    got = teacher.targets(_rows(c, b))  # b was kept, c is new: a goes
    assert [t.columns.tolist() for t in got] == [t.columns.tolist() for t in expected]
    assert len(teacher._rows_cache) == 2
    small = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0, cached_rows=1)
    assert len(small.targets(_rows(a, b, c))[0].rows) == 2 + 3 + 1  # more rows than it keeps
    assert len(small._rows_cache) == 1


def test_the_loss_is_the_cross_entropy_against_the_teacher_over_each_levels_tokens():
    teacher = SasrecTeacher(_sasrec(), CATALOG, bos_token_id=BOS, weight=1.0)
    batch = _window([0, 2, 1])
    levels = teacher.targets(batch)
    logits = torch.randn(1, batch["input_ids"].shape[1], VOCAB)
    expected = torch.cat(
        [-(t.probs * logits[0, t.columns][:, t.tokens].log_softmax(-1)).sum(-1) for t in levels]
    ).mean()
    torch.testing.assert_close(teacher.loss(levels, logits), expected)
    # from the states the logits came from and the output weight: the same loss
    states, head = torch.randn(1, logits.shape[1], 8), torch.randn(VOCAB, 8)
    torch.testing.assert_close(
        teacher.loss(levels, states @ head.T, states=states, head=head),
        teacher.loss(levels, states @ head.T),
    )
    # a model whose distribution over the level's tokens is the teacher's pays only the
    # teacher's entropy, whatever it gives the other tokens
    exact = torch.randn_like(logits)
    entropy = []
    for t in levels:
        log_t = t.probs.clamp_min(1e-30).log()
        exact[0, t.columns[:, None], t.tokens[None, :]] = log_t
        entropy.append(-(t.probs * log_t).sum(-1))
    torch.testing.assert_close(teacher.loss(levels, exact), torch.cat(entropy).mean())


def test_a_catalog_that_does_not_match_sasrecs_is_refused():
    with pytest.raises(ValueError, match="3 SIDs for a SASRec catalog of 4 items"):
        SasrecTeacher(_sasrec(), CATALOG[:3], bos_token_id=BOS, weight=1.0)


def _ease(item_ids: list[str]) -> EASE:
    """An EASE with hand-set weights: item 3 follows item 0, item 1 follows item 2."""
    ease = EASE(item_ids=item_ids, recency=0.5)
    ease.weights[0, 3] = 2.0
    ease.weights[2, 1] = 1.0
    return ease


def test_an_ease_blend_scores_items_as_sasrec_plus_alpha_times_eases_standardized_scores():
    sasrec = _sasrec()
    teacher = SasrecTeacher(
        sasrec, CATALOG, bos_token_id=BOS, weight=1.0, ease=_ease(sasrec.item_ids), ease_weight=3.0
    )
    first = teacher.targets(_window([0, 2, 1]))[0]
    with torch.no_grad():  # item 1's place: history [0, 2], EASE reads 0 at 0.5 and 2 at 1
        scores = sasrec.scores(sasrec(torch.tensor([[1, 3]]))[0, -1])
    ease = torch.tensor([0.0, 1.0, 0.0, 1.0])  # 2 → 1 (1.0) and 0 → 3 (0.5 × 2.0)
    z = (ease - ease.mean()) / ease.std()
    blended = scores + 3.0 * scores.std() * z
    blended[[0, 2]] = float("-inf")  # seen
    p = blended.softmax(-1)
    torch.testing.assert_close(first.probs[1], torch.stack([p[0] + p[1], p[2] + p[3]]))
    # the blend ranks as z(sasrec) + α z(ease), whatever SASRec's scale
    raw = torch.tensor([[0.3, 2.0, -1.0, 0.5]])
    zs = (raw - raw.mean()) / raw.std()
    assert torch.equal(
        blend(raw, ease[None], 3.0).argsort(descending=True),
        (zs + 3.0 * z).argsort(descending=True),
    )
    # weight 0: SASRec's targets
    plain = SasrecTeacher(sasrec, CATALOG, bos_token_id=BOS, weight=1.0)
    off = SasrecTeacher(
        sasrec, CATALOG, bos_token_id=BOS, weight=1.0, ease=_ease(sasrec.item_ids), ease_weight=0
    )
    for a, b in zip(
        off.targets(_window([0, 2, 1])), plain.targets(_window([0, 2, 1])), strict=True
    ):
        torch.testing.assert_close(a.probs, b.probs)


def test_an_ease_of_another_catalog_is_refused():
    with pytest.raises(ValueError, match="same catalog in the same order"):
        SasrecTeacher(
            _sasrec(), CATALOG, bos_token_id=BOS, weight=1.0, ease=_ease(["b", "a", "c", "d"])
        )
