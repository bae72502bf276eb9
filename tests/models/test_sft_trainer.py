"""The SFT sampler: batches of similar length, in random order, every example once."""

from __future__ import annotations

import torch

from models.sft_trainer import ShuffledLengthGroupedSampler


def test_batches_group_lengths_cover_everything_and_come_in_random_order():
    # 40 long examples (windows) and 60 short ones (alignment pairs), interleaved
    lengths = [200 if k % 5 < 2 else 20 for k in range(100)]
    sampler = ShuffledLengthGroupedSampler(
        8, lengths=lengths, generator=torch.Generator().manual_seed(0)
    )
    first = list(sampler)
    assert sorted(first) == list(range(100))  # one epoch: every example once
    batches = [first[i : i + 8] for i in range(0, 100, 8)]
    mixed = [b for b in batches if len({lengths[i] for i in b}) > 1]
    # mega-batches of 3 x 8 = 24 examples (transformers: min(100 // 32, 50) batches): at most
    # one mixed batch where each mega-batch's sorted lengths step down, 5 mega-batches
    assert len(mixed) <= 5 and len(batches) - len(mixed) >= 8
    # not all long batches first (transformers' sorted mega-batches would be)
    kinds = ["long" if lengths[b[0]] == 200 else "short" for b in batches[:-1]]
    assert kinds != sorted(kinds) and kinds != sorted(kinds, reverse=True)
    assert len(batches[-1]) == 100 % 8  # the short batch stays last
    assert list(sampler) != first  # a new order each epoch
