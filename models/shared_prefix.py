"""Completion logits with each distinct prompt encoded once.

A GRPO batch holds every prompt G times (one copy per completion), and a SID completion is
only L + 1 tokens after a prompt of ~60. Scoring the batch as it comes runs the decoder over
every copy of every prompt token; here each distinct prompt runs once with a key/value cache,
the cache is gathered back to one row per completion, and only the completion tokens run on
top of it. Autograd flows through the gathered cache, so the gradient is the plain path's.

Under gradient (activation) checkpointing a layer drops the cache while training; the rows are
then scored as they come. Positions and masks are what the plain forward of the concatenated
rows uses: the cache continues the prompt's positions and the completion forward sees the whole
attention mask.
"""

from __future__ import annotations

from typing import Any

import torch


def completion_logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
) -> torch.Tensor:
    """(rows, logits_to_keep, vocab) logits scoring the last ``logits_to_keep`` tokens of
    ``input_ids`` (prompt + completion per row; the logit at place t scores token t + 1), each
    distinct (prompt ids, prompt mask) encoded once. A causal decoder whose forward takes
    ``past_key_values`` and ``logits_to_keep`` (Hugging Face's ``*ForCausalLM``)."""
    if logits_to_keep < 1 or logits_to_keep >= input_ids.shape[1]:
        raise ValueError(
            f"logits_to_keep={logits_to_keep} must leave 1..{input_ids.shape[1] - 1} prompt tokens"
        )
    if model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        # a checkpointed layer drops the cache while training: score the rows as they come
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            logits_to_keep=logits_to_keep + 1,
            use_cache=False,
        ).logits
        return logits[:, :-1]  # the logit at place t scores the token at t + 1
    prompt_len = input_ids.shape[1] - logits_to_keep
    prompt = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], dim=1)
    unique, row_of = torch.unique(prompt, dim=0, return_inverse=True)
    out = model(
        input_ids=unique[:, :prompt_len],
        attention_mask=unique[:, prompt_len:],
        use_cache=True,
        logits_to_keep=1,  # the last prompt place scores the first completion token
    )
    cache = out.past_key_values
    cache.reorder_cache(row_of)  # one cache row per completion (index_select: differentiable)
    first = out.logits[row_of, -1:]
    if logits_to_keep == 1:
        return first
    rest = model(
        input_ids=input_ids[:, prompt_len:-1],  # the last completion token scores nothing
        attention_mask=attention_mask[:, :-1],
        past_key_values=cache,
        use_cache=True,
    ).logits
    return torch.cat([first, rest], dim=1)
