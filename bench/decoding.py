"""Benchmark: one constrained SID decoding step on CPU (2 threads).

    python -m bench.decoding

Batch 8 × beam 20 = 160 rows; catalog 1682 items (MovieLens-100k size) with random unique
3-level SIDs, K = 256. For a Qwen2.5-sized vocab (151,936) and our tiny preset's (2,000 text tokens + 768 SID),
at steps t = 1 and t = 2, the median of 20 calls (after warm-up) of:

- ours: ``SidConstrainedLogitsProcessor`` (in place, as in beam search; and with a copy, as
  greedy/sampling with ``output_logits`` need);
- per-row dict: a prefix → allowed-tokens dictionary looked up row by row in Python, building
  a (rows × vocab) mask (the usual research-code approach; written here for comparison only);
- forward: one cached decode step of a *small* Qwen2 (hidden 256, 2 layers) at that vocab,
  for scale. A real Qwen2.5-0.5B step (hidden 896, 24 layers) costs several times more, so
  the overhead column is an upper bound.

Then the trie's table memory for 1682 and 1,000,000 items (L = 3, K = 256).
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import transformers
from transformers import LogitsProcessor

from bench.common import bench_args
from models.constrained import SidConstrainedLogitsProcessor
from models.sid_trie import SidTrie

LEVELS, K, N_ITEMS, BATCH, BEAMS, PROMPT = 3, 256, 1682, 8, 20, 32
EOS = 1


def random_sid_tokens(n_items: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """(n_items, L) distinct random SIDs as token ids at the end of the vocab (level l:
    ``vocab − L·K + l·K + code``), like tokens added to a pretrained tokenizer."""
    keys = np.random.default_rng(seed).choice(K**LEVELS, size=n_items, replace=False)
    codes = np.stack([(keys // K ** (LEVELS - 1 - lv)) % K for lv in range(LEVELS)], axis=1)
    return torch.from_numpy(codes) + (vocab - LEVELS * K) + K * torch.arange(LEVELS)


class DictPrefixProcessor(LogitsProcessor):
    """Comparison only: prefix dictionary, one Python lookup per row, a full mask per step."""

    def __init__(self, sid_token_ids: torch.Tensor, eos_token_id: int):
        rows = sid_token_ids.tolist()
        self.levels, self.eos = len(rows[0]), eos_token_id
        self.sid_tokens = {tok for row in rows for tok in row}
        nexts: dict[tuple[int, ...], set[int]] = {}
        for row in rows:
            for t in range(self.levels):
                nexts.setdefault(tuple(row[:t]), set()).add(row[t])
        self.allowed = {prefix: sorted(tokens) for prefix, tokens in nexts.items()}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        mask = torch.full_like(scores, float("-inf"))
        for row in range(input_ids.shape[0]):
            tail = input_ids[row, -(self.levels + 1) :].tolist()
            t = 0
            while t < len(tail) and tail[-1 - t] in self.sid_tokens:
                t += 1
            mask[row, self.allowed.get(tuple(tail[len(tail) - t :]), [self.eos])] = 0
        return scores + mask


def rows_at_step(sid_token_ids: torch.Tensor, step: int, vocab: int, seed: int) -> torch.Tensor:
    """160 rows: a random non-SID prompt, then the first ``step`` tokens of a random item."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, vocab - LEVELS * K, (BATCH * BEAMS, PROMPT), generator=gen)
    items = torch.randint(0, len(sid_token_ids), (BATCH * BEAMS,), generator=gen)
    return torch.cat([prompt, sid_token_ids[items, :step]], dim=1)


class Timing(NamedTuple):
    median: float
    min: float

    def __str__(self) -> str:
        return f"{self.median:.2f} ({self.min:.2f})"


Case = tuple[Callable[[], object], Callable[[], object]]
"""(timed call, untimed setup run before each call)."""


def time_ms(case: Case, repeats: int = 20, warmup: int = 3) -> Timing:
    """Median and minimum milliseconds of one case over consecutive calls, as in decoding,
    where the processor runs every step right after the (multi-threaded) forward pass.
    (Interleaving cases instead makes the single-threaded dict baseline put torch's worker
    threads to sleep, and on a busy machine waking them costs ~10 ms per call.)"""
    fn, setup = case
    times = []
    for k in range(warmup + repeats):
        setup()
        started = time.perf_counter()
        fn()
        if k >= warmup:
            times.append(1000 * (time.perf_counter() - started))
    return Timing(statistics.median(times), min(times))


def forward_case(vocab: int) -> Case:
    """One cached decode step of a small Qwen2 for all rows (logits of the new token only)."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=vocab,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=1024,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    ids = torch.randint(2, vocab, (BATCH * BEAMS, PROMPT))
    with torch.no_grad():
        prefill = model(ids, use_cache=True, logits_to_keep=1).past_key_values
    state: dict[str, object] = {}

    def setup() -> None:
        state["cache"] = copy.deepcopy(prefill)

    @torch.no_grad()
    def step() -> None:
        model(ids[:, -1:], past_key_values=state["cache"], use_cache=True)

    return step, setup


def processor_case(processor: LogitsProcessor, ids: torch.Tensor, base: torch.Tensor) -> Case:
    """``processor`` on a fresh copy of ``base`` (the copy is not timed)."""
    work = base.clone()
    return (lambda: processor(ids, work)), (lambda: work.copy_(base))


def main() -> None:
    args = bench_args(__doc__)

    print(
        f"{BATCH} prompts × {BEAMS} beams = {BATCH * BEAMS} rows, catalog {N_ITEMS} items × "
        f"L={LEVELS} × K={K}, torch threads: {args.threads}; ms: median (min) of 20 calls; "
        f"machine load average {os.getloadavg()[0]:.1f} at start\n"
    )
    cores = os.cpu_count() or 1
    if args.threads > 1 and os.getloadavg()[0] > 1.0:  # another process holds a core
        print(
            f"**Busy machine** ({cores} cores, load {os.getloadavg()[0]:.1f}): with "
            f"{args.threads} threads each parallel op may wait for a descheduled worker; "
            "compare with an idle machine or `--threads 1`.\n"
        )
    print(
        "| vocab | rows | step t | ours ms | ours (copy) ms | per-row dict ms | speed-up "
        "| forward ms (small model) | overhead % (medians) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for vocab in (151_936, 2_000 + LEVELS * K):
        tokens = random_sid_tokens(N_ITEMS, vocab)
        trie = SidTrie(sid_token_ids=tokens)
        ours = SidConstrainedLogitsProcessor(trie=trie, eos_token_id=EOS)
        ours_copy = SidConstrainedLogitsProcessor(trie=trie, eos_token_id=EOS, inplace=False)
        baseline = DictPrefixProcessor(tokens, EOS)
        base = torch.randn(BATCH * BEAMS, vocab).log_softmax(-1)
        forward = time_ms(forward_case(vocab))
        for step in (1, 2):
            ids = rows_at_step(tokens, step, vocab, seed=step)
            assert torch.equal(ours(ids, base.clone()), baseline(ids, base))
            mine = time_ms(processor_case(ours, ids, base))
            copied = time_ms(processor_case(ours_copy, ids, base))
            dic = time_ms(processor_case(baseline, ids, base))
            print(
                f"| {vocab:,} | {BATCH * BEAMS} | {step} | {mine} | {copied} | {dic} "
                f"| {dic.median / mine.median:.1f}× | {forward} "
                f"| {100 * mine.median / forward.median:.0f} % |"
            )

    print("\n| items | trie tables | bytes / item | build s |")
    print("|---|---|---|---|")
    for n_items in (N_ITEMS, 1_000_000):
        tokens = random_sid_tokens(n_items, 151_936, seed=1)
        started = time.perf_counter()
        trie = SidTrie(sid_token_ids=tokens)
        build = time.perf_counter() - started
        print(
            f"| {n_items:,} | {trie.nbytes / 2**20:.2f} MiB | {trie.nbytes / n_items:.0f} "
            f"| {build:.2f} |"
        )
    print(
        "\nMemory is O(n_items · L): one int64 key and token per trie edge (≤ n_items · L),"
        "\none offset per node (≤ 1 + n_items · L), one item row per leaf; per step the"
        "\nprocessor gathers rows × max_fanout ids and does no rows × vocab mask."
    )


if __name__ == "__main__":
    main()
