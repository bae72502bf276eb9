"""Prompt templates: the one place SFT, GRPO and evaluation build their text.

Every prompt ends with a non-SID text token (``:``), so the constrained decoder can tell
generated SID tokens from the prompt without state. Completions are SID token strings
(``<a_12><b_3><c_7>``) or titles; the tokenizer's EOS is appended by the trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

from models.sid import sid_string

log = logging.getLogger(__name__)

TASKS = ("seq_rec", "sid2title", "title2sid", "title_history")
"""seq_rec: SID history → next SID (the main task); sid2title / title2sid: align SIDs with
item text; title_history: title history → next SID."""


class Example(NamedTuple):
    prompt: str
    completion: str


def seq_rec_prompt(history_sids: Sequence[Sequence[int]]) -> str:
    return (
        "The user interacted with " + "".join(sid_string(s) for s in history_sids) + ". Next item:"
    )


def title_history_prompt(history_titles: Sequence[str]) -> str:
    return "The user interacted with " + "; ".join(history_titles) + ". Next item:"


def sid2title_prompt(sid: Sequence[int]) -> str:
    return f"Item {sid_string(sid)} is titled:"


def title2sid_prompt(title: str) -> str:
    return f'The item titled "{title}" has the ID:'


def fit_history(
    history: Sequence[str],
    render: Callable[[Sequence[str]], str],
    count_tokens: Callable[[str], int],
    max_tokens: int,
) -> tuple[str, bool]:
    """The prompt for the longest suffix of ``history`` that fits ``max_tokens`` (oldest items are
    dropped first: truncation from the left). Returns (prompt, truncated)."""
    start = 0
    prompt = render(history)
    while count_tokens(prompt) > max_tokens and start < len(history) - 1:
        start += 1
        prompt = render(history[start:])
    return prompt, start > 0
