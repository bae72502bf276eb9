"""Prompt templates: the one place SFT, GRPO and evaluation build their text.

Every prompt ends with a non-SID text token (``:``), so the constrained decoder can tell
generated SID tokens from the prompt without state. Completions are SID token strings
(``<a_12><b_3><c_7>``) or titles; the tokenizer's EOS is appended by the trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

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


class PromptBuilder:
    """Prompts and prompt/completion pairs for one tokenizer, history prompts cut to fit its
    context (``truncated`` counts how many lost items)."""

    def __init__(
        self,
        *,
        tokenizer: Any,
        sid_map: Mapping[str, Sequence[int]],
        titles: Mapping[str, str],
        max_length: int,
    ):
        self.tokenizer = tokenizer
        self.sid_map = sid_map
        self.titles = titles
        levels = len(next(iter(sid_map.values())))
        self.max_prompt = max_length - levels - 2  # room for the SID and EOS
        self.truncated = 0

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def history_prompt(self, history: Sequence[str], by_title: bool = False) -> str:
        """The seq_rec (or title_history) prompt for ``history``, oldest items dropped to fit."""

        def render(items: Sequence[str]) -> str:
            if by_title:
                return title_history_prompt([self.titles[i] for i in items])
            return seq_rec_prompt([self.sid_map[i] for i in items])

        prompt, cut = fit_history(history, render, self.count, self.max_prompt)
        self.truncated += cut
        return prompt

    def history_example(
        self, history: Sequence[str], target: str, by_title: bool = False
    ) -> Example:
        return Example(self.history_prompt(history, by_title), sid_string(self.sid_map[target]))

    def alignment_examples(self, task: str) -> list[Example]:
        """sid2title or title2sid pairs for every catalog item."""
        if task == "sid2title":
            return [
                Example(sid2title_prompt(self.sid_map[i]), " " + t) for i, t in self.titles.items()
            ]
        return [
            Example(title2sid_prompt(t), sid_string(self.sid_map[i]))
            for i, t in self.titles.items()
        ]
