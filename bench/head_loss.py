"""Benchmark: the SFT loss through the output layer, the model's own way and in one step.

    python -m bench.head_loss [--threads 2] [--repeats 10]

A batch of SFT's default shape (24 packed rows of 256 tokens, 80% of the positions labelled:
the share measured on MovieLens's batches) through the default tiny model (a Qwen2 decoder
built from config: hidden 128, 2 layers, vocabulary 2,768 = 2,000 text + 768 SID tokens), and
through SmolLM2-135M's shape (hidden 576, vocabulary 49,152 + 768) for the output layer alone.
For each, the median of ``--repeats`` forward + backward passes (after one warm-up) of:

- model: ``F.linear`` onto the whole vocabulary at every position, then ``F.cross_entropy``
  (what the model's own loss does);
- one step: :func:`models.head_loss.head_cross_entropy` (labelled positions only, in blocks);

and the largest difference of the loss and of the gradients between the two. "step" rows time
the whole tiny model (decoder layers included) with each loss.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from bench.common import bench_args
from models.head_loss import head_cross_entropy

ROWS, TOKENS, LABELLED = 24, 256, 0.8
TINY = {"hidden": 128, "vocab": 2768}
SMOLLM2 = {"hidden": 576, "vocab": 49152 + 768}

Result = tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]
"""Median seconds, the loss, and two gradients (accumulated over every pass, as many in each way)."""


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=10, help="timed passes per row")


def _labels(vocab: int, generator: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, vocab, (ROWS, TOKENS), generator=generator)
    labels[torch.rand(ROWS, TOKENS, generator=generator) > LABELLED] = -100
    return labels


def _model_loss(states: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(states, weight)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")


def _timed(run: Callable[[], torch.Tensor], repeats: int) -> tuple[float, torch.Tensor]:
    """Median seconds of ``run()`` + its backward, and the last loss."""
    run().backward()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loss = run()
        loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times), loss.detach()


def _head_rows(name: str, shape: dict[str, int], repeats: int) -> list[str]:
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(ROWS, TOKENS, shape["hidden"], generator=generator).requires_grad_()
    weight = (
        torch.randn(shape["vocab"], shape["hidden"], generator=generator) * 0.05
    ).requires_grad_()
    labels = _labels(shape["vocab"], generator)
    results: dict[str, Result] = {}
    ways: dict[str, Callable[..., torch.Tensor]] = {
        "model": _model_loss,
        "one step": head_cross_entropy,
    }
    for way, loss_of in ways.items():
        states.grad = weight.grad = None
        seconds, loss = _timed(partial(loss_of, states, weight, labels), repeats)
        assert states.grad is not None and weight.grad is not None
        results[way] = (seconds, loss, states.grad.clone(), weight.grad.clone())
    return _compare(f"head, {name}", results)


def _step_rows(repeats: int) -> list[str]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=TINY["vocab"],
        hidden_size=TINY["hidden"],
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TOKENS,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).train()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, TINY["vocab"], (ROWS, TOKENS), generator=generator)
    labels = F.pad(_labels(TINY["vocab"], generator), (0, 1), value=-100)[:, 1:]

    def model_way() -> torch.Tensor:
        logits = model(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")

    def one_step() -> torch.Tensor:
        states = model.model(input_ids=ids, use_cache=False).last_hidden_state
        return head_cross_entropy(states, model.lm_head.weight, labels)

    results: dict[str, Result] = {}
    for way, run in (("model", model_way), ("one step", one_step)):
        model.zero_grad()
        seconds, loss = _timed(run, repeats)
        embed = model.model.embed_tokens.weight.grad.clone()  # the tied output layer's too
        results[way] = (seconds, loss, embed, embed)
    return _compare("step, tiny model", results)


def _compare(name: str, results: dict[str, Result]) -> list[str]:
    (t_model, loss_model, *grads_model), (t_ours, loss_ours, *grads_ours) = results.values()
    loss_diff = abs(float(loss_model - loss_ours)) / abs(float(loss_model))
    grad_diff = max(
        float((a - b).abs().max() / a.abs().max().clamp(min=1e-30))
        for a, b in zip(grads_model, grads_ours, strict=True)
    )
    return [
        f"| {name} | {t_model * 1000:.1f} | {t_ours * 1000:.1f} | {t_ours / t_model:.2f} "
        f"| {loss_diff:.1e} | {grad_diff:.1e} |"
    ]


def main() -> None:
    args = bench_args(__doc__, _options)
    print(f"{ROWS} rows x {TOKENS} tokens, {LABELLED:.0%} labelled, {args.threads} threads\n")
    print("| what | model ms | one step ms | ratio | loss rel. diff | grad rel. diff |")
    print("|---|---|---|---|---|---|")
    for row in (
        *_head_rows("tiny (128 x 2,768)", TINY, args.repeats),
        *_step_rows(args.repeats),
        *_head_rows("SmolLM2-135M (576 x 49,920)", SMOLLM2, max(2, args.repeats // 5)),
    ):
        print(row, flush=True)


if __name__ == "__main__":
    main()
