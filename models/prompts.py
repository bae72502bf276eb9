"""Prompt templates: the one place SFT, GRPO and evaluation build their text.

A model reads histories in one of two formats (:data:`PROMPT_FORMATS`), chosen by the SFT
objective that trained it and stored in its config (:func:`set_prompt_format`), so every
place that loads the model (evaluate, GRPO, the served model, a warm start) prompts it the
way it was trained:

- ``text``: ``The user interacted with <a_1><b_2><c_3><a_4>…. Next item:`` (``sft.objective:
  rows``, the MiniOneRec prompt);
- ``sequence``: ``<bos><a_1><b_2><c_3><eos><a_4>…<eos>``, each item's SID followed by the
  tokenizer's EOS (``sft.objective: sequence``, trained on whole windows of a user's items).

Either way a prompt ends with a non-SID token (``:`` or EOS), so the constrained decoder can
tell generated SID tokens from the prompt without state, and a completion is a SID token
string (``<a_12><b_3><c_7>``) or a title followed by EOS (appended by the trainer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, get_args

from models.sid import sid_string

log = logging.getLogger(__name__)

PromptFormat = Literal["text", "sequence"]
PROMPT_FORMATS: tuple[PromptFormat, ...] = get_args(PromptFormat)
FORMAT_KEY = "sidrec_prompt_format"
"""The model config attribute (saved in config.json) naming the model's prompt format."""

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


def sequence_prompt(history_sids: Sequence[Sequence[int]], bos: str, eos: str) -> str:
    """``bos`` then each item's SID followed by ``eos`` (the ``sequence`` format)."""
    return bos + "".join(sid_string(s) + eos for s in history_sids)


def prompt_format(model: Any) -> PromptFormat:
    """The prompt format a model was trained with (``text`` when its config names none: models
    saved before formats existed)."""
    value = getattr(model.config, FORMAT_KEY, None) or "text"
    if value not in PROMPT_FORMATS:
        raise ValueError(f"the model's config names an unknown prompt format {value!r}")
    return value


def set_prompt_format(model: Any, fmt: PromptFormat) -> None:
    """Record ``fmt`` in the model's config, so it is saved with the model."""
    setattr(model.config, FORMAT_KEY, fmt)


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
        fmt: PromptFormat = "text",
    ):
        """``fmt``: how history prompts look (the model's :func:`prompt_format`)."""
        if fmt not in PROMPT_FORMATS:
            raise ValueError(f"unknown prompt format {fmt!r}; one of {', '.join(PROMPT_FORMATS)}")
        self.tokenizer = tokenizer
        self.sid_map = sid_map
        self.titles = titles
        self.format = fmt
        self.eos = tokenizer.eos_token
        self.bos = tokenizer.bos_token or tokenizer.eos_token
        levels = len(next(iter(sid_map.values())))
        self.max_length = max_length
        self.max_prompt = max_length - levels - 2  # room for the SID and EOS
        self.truncated = 0
        self.texts_cut = 0
        """Alignment pairs whose item text was cut to fit the context (the SID never is)."""

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def history_prompt(self, history: Sequence[str], by_title: bool = False) -> str:
        """The seq_rec (or title_history) prompt for ``history``, oldest items dropped to fit."""

        def render(items: Sequence[str]) -> str:
            if by_title:
                return title_history_prompt([self.titles[i] for i in items])
            sids = [self.sid_map[i] for i in items]
            if self.format == "sequence":
                return sequence_prompt(sids, self.bos, self.eos)
            return seq_rec_prompt(sids)

        prompt, cut = fit_history(history, render, self.count, self.max_prompt)
        self.truncated += cut
        return prompt

    def history_example(
        self, history: Sequence[str], target: str, by_title: bool = False
    ) -> Example:
        return Example(self.history_prompt(history, by_title), sid_string(self.sid_map[target]))

    def sequence_example(self, items: Sequence[str]) -> Example:
        """A window of a user's items as one example: every item's SID and EOS is a target."""
        completion = sequence_prompt([self.sid_map[i] for i in items], "", self.eos)
        return Example(self.bos, completion)

    def alignment_examples(self, task: str) -> list[Example]:
        """sid2title or title2sid pairs for every catalog item, each item text cut to fit the
        context where it is too long (counted in ``texts_cut``): the trainer would otherwise cut
        the pair's end, the SID of a title2sid pair or the EOS of a sid2title one."""
        examples = []
        for item, text in self.titles.items():
            sid = self.sid_map[item]
            if task == "sid2title":
                prompt = sid2title_prompt(sid)
                fitted = self._fit(text, lambda t: " " + t, self.count(prompt))
                examples.append(Example(prompt, " " + fitted))
            else:
                examples.append(Example(self.title_prompt(item), sid_string(sid)))
        return examples

    def title_prompt(self, item: str) -> str:
        """The title2sid prompt for ``item``, its text cut (and counted in ``texts_cut``) where
        the prompt and the item's SID would not fit the context: the SFT pair's prompt, and GRPO's
        title prompt (``grpo.title_prompts``), whose completion is that SID."""
        fitted = self._fit(self.titles[item], title2sid_prompt, len(self.sid_map[item]))
        return title2sid_prompt(fitted)

    def _fit(self, text: str, render: Callable[[str], str], others: int) -> str:
        """``text``, or its longest token prefix for which ``render(text)`` and ``others``
        tokens (the rest of the pair) leave room for BOS and EOS in the context."""
        room = self.max_length - 2 - others
        if self.count(render(text)) <= room:
            return text
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        low, high = 0, len(ids)
        while low < high:  # the longest prefix that fits
            mid = (low + high + 1) // 2
            if self.count(render(self.tokenizer.decode(ids[:mid]))) <= room:
                low = mid
            else:
                high = mid - 1
        self.texts_cut += 1
        return str(self.tokenizer.decode(ids[:low]))
