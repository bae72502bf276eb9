"""GRPO over semantic IDs: TRL's ``GRPOTrainer`` with constrained rollouts.

One narrow override of the generation step (``_generate_single_turn``): prompts arrive as G
consecutive copies; the trainer generates once per distinct prompt, through the SID-trie
logits processor, so every completion is a catalog item's SID followed by EOS:

- ``beam`` (MiniOneRec / ReRe): the G best distinct items by constrained beam search, best
  first. Beam top-G is deterministic, not a sample from the policy: the GRPO objective then
  acts as an advantage-weighted ranking update over the policy's own top-G.
- ``sample``: G constrained temperature samples (items may repeat).
- ``dynamic``: ``oversample`` × G constrained samples, G distinct items kept (most likely
  first).

A dataset column ``exclude_index`` (per prompt, catalog rows the user already had) keeps
those items out of the prompt's group, as evaluation never ranks them (all three modes; not
the vLLM path, whose regex constraint knows no per-prompt exclusions).

With ``ensure_target`` (beam and dynamic rollouts; MiniOneRec's ``add_gt``) a group that misses
its target gets it in the last place, so every group carries the target's signal; the group
stays G distinct catalog items. Every rollout logs, before any insertion, how often the target
was in the group (``rollout/target_in_group``) and its mean 1-based place there when it was
(``rollout/target_rank``).

A fourth override, of ``_get_per_token_logps_and_entropies``, computes the completions'
log-probs (policy, old policy and reference) from the model's plain logits at the completion
places only, each distinct prompt encoded once for its G completions
(:mod:`models.shared_prefix`), on a CPU and wherever ``trie_mask`` is on. TRL's own path,
kept on GPUs, scores them through its fused LM head, which on a device without Triton
projects every position of prompt and completion onto the vocabulary (the tile shapes then
stay fixed): with prompts of ~20 items and 4-token completions that is ~20x the positions
needed, and it was most of a GRPO step on 2 CPU cores. With ``trie_mask`` everything the trie forbids at each place is masked
out first, so the loss is over catalog items only.

Two more small overrides hand the rollout facts to the rewards: the catalog row of each
completion (``completion_item``) and its rank in the group (``rank``) become columns, and the
batch's targets are read for ``ensure_target`` and the target logs. Rewards, advantages,
losses (grpo, dapo, dr_grpo, bnpo, GSPO), the reference model and logging are TRL's own.

Under ``accelerate launch`` each process rolls out its own prompts. A group never spans two
processes: TRL's ``RepeatSampler`` puts a prompt's G copies next to each other and each process
takes whole per-device batches of the sampled stream, so a per-device batch that is a multiple
of G (``tasks/grpo.py`` sets prompts per process × G) holds whole groups, as
:func:`_distinct_prompts` checks. TRL gathers every process's rewards in rank order before it
normalizes them per G consecutive rows: the same groups. ``shard`` records each process's prompts.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import trl
from transformers import LogitsProcessorList
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from models.constrained import SidConstrainedLogitsProcessor, generate_sids, left_pad
from models.grpo_config import SidGRPOConfig, check_group_size
from models.metrics import exclusion_mask
from models.rewards import NO_TARGET
from models.sft_anchor import SftAnchor
from models.shards import ShardRecord
from models.shared_prefix import completion_logits
from models.sid_trie import SidTrie

log = logging.getLogger(__name__)

TESTED_TRL = "1.16.0"
"""The TRL release whose private ``GRPOTrainer`` methods (``_OVERRIDDEN``) this subclass overrides."""
_OVERRIDDEN = (
    "_generate_single_turn",
    "_generate_and_score_completions",
    "_calculate_rewards",
    "_get_per_token_logps_and_entropies",
)


def check_trl_version(version: str = trl.__version__) -> None:
    """Fail clearly on a TRL whose private generation API this override was not tested with."""
    if version != TESTED_TRL:
        raise RuntimeError(
            f"SidGRPOTrainer overrides GRPOTrainer.{', '.join(_OVERRIDDEN)} of trl=={TESTED_TRL}, "
            f"but trl {version} is installed; these private methods change between releases. "
            f"Install the pinned set (pip install -c constraints.txt trl=={TESTED_TRL}) or re-check "
            "the override against the new trainer before changing the pin."
        )
    signature = inspect.signature(GRPOTrainer._generate_single_turn)
    expected = ["self", "prompt_ids", "images", "multimodal_fields", "num_generations"]
    if list(signature.parameters)[: len(expected)] != expected:
        raise RuntimeError(
            f"GRPOTrainer._generate_single_turn{signature} no longer matches the tested "
            f"signature; SidGRPOTrainer needs updating for this TRL"
        )
    signature = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies)
    expected = ["self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"]
    if list(signature.parameters)[: len(expected)] != expected:
        raise RuntimeError(
            f"GRPOTrainer._get_per_token_logps_and_entropies{signature} no longer matches the "
            "tested signature; SidGRPOTrainer needs updating for this TRL"
        )


class RolloutRewards(NamedTuple):
    """One scored generation batch, one entry per completion (groups of G consecutive rows)."""

    step: int
    inputs: list[dict[str, Any]]
    items: list[int]
    ranks: list[int]
    rewards: torch.Tensor
    """(completions, reward functions), NaN where a function could not score."""
    names: list[str]


class SidGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose rollouts are constrained to the catalog's SIDs (see module doc)."""

    def __init__(
        self,
        *,
        trie: SidTrie,
        args: SidGRPOConfig,
        on_rewards: Callable[[RolloutRewards], None] | None = None,
        anchor: SftAnchor | None = None,
        **kwargs: Any,
    ):
        """``trie``: the catalog's SIDs as token ids of ``processing_class``. ``on_rewards``:
        called with every scored generation batch (e.g. to log sample tables). ``anchor``: its
        weighted SFT loss joins every training step's loss (``grpo.sft_anchor``). Every other
        keyword goes to ``GRPOTrainer`` (model, reward_funcs, train_dataset, processing_class, ...)."""
        check_trl_version()
        super().__init__(args=args, **kwargs)
        if args.num_generations is not None:
            check_group_size(args.num_generations, trie.n_items)
        self.sid_args = args  # typed: self.args is TrainingArguments to type checkers
        self.sid_tokenizer: Any = self.processing_class
        self.trie = trie
        self.on_rewards = on_rewards
        self.anchor = anchor
        self._rollout: dict[str, list[int]] = {}
        self._batch_targets: list[int] | None = None
        self._batch_exclude: list[list[int]] | None = None
        self.shard = ShardRecord()  # the prompts this process trained on

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.anchor is None or not model.training:
            return loss
        anchor = self.anchor.loss(model, loss.device)
        self._metrics["train"]["sft_anchor_loss"].append(float(anchor.detach()))
        return loss + self.anchor.weight * anchor

    # --- the three overrides

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # remember the targets of this generation batch (ensure_target and the target logs)
        self._batch_targets = [int(x["target_index"]) for x in inputs] if inputs else None
        has_exclude = bool(inputs) and "exclude_index" in inputs[0]
        self._batch_exclude = [list(x["exclude_index"]) for x in inputs] if has_exclude else None
        model: Any = self.model
        if inputs and model.training:  # this process's prompts (its shard under accelerate)
            g = self.num_generations
            self.shard.add([[*x["history_index"], x["target_index"]] for x in inputs[::g]])
        out = super()._generate_and_score_completions(inputs)
        if self.sid_args.positive_only:  # after TRL's logs, which show the advantages' spread
            out["advantages"] = out["advantages"].clamp(min=0)
        return out

    def _calculate_rewards(
        self, inputs: list[dict[str, Any]], prompts: Any, completions: Any, completion_ids_list: Any
    ) -> torch.Tensor:
        for i, row in enumerate(inputs):
            row["completion_item"] = self._rollout["items"][i]
            row["rank"] = self._rollout["ranks"][i]
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.on_rewards is not None:
            self.on_rewards(
                RolloutRewards(
                    step=self.state.global_step,
                    inputs=inputs,
                    items=self._rollout["items"],
                    ranks=self._rollout["ranks"],
                    rewards=rewards.detach().cpu(),
                    names=list(self.reward_func_names),
                )
            )
        return rewards

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        trl_only = compute_aux_loss or any(v is not None for v in multimodal.values())
        if not self.sid_args.trie_mask and (trl_only or input_ids.device.type != "cpu"):
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )
        if trl_only:
            raise ValueError(
                "trie_mask scores text-only, dense models (no MoE aux loss, no images)"
            )
        batch_size = batch_size or input_ids.size(0)
        eos = int(self.sid_tokenizer.eos_token_id)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids = input_ids[start : start + batch_size]
            mask = attention_mask[start : start + batch_size]
            with self.accelerator.autocast():  # each distinct prompt once (G copies arrive)
                logits = completion_logits(model, ids, mask, logits_to_keep)
            logits = logits.float() / self.temperature
            completion = ids[:, -logits_to_keep:]
            if self.sid_args.trie_mask:
                logp, entropy = trie_masked_logps(self.trie, logits, completion, eos)
            else:
                logp, entropy = vocabulary_logps(logits, completion)
            logps.append(logp)
            entropies.append(entropy)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _generate_single_turn(
        self,
        prompt_ids: list[list[int]],
        images: Any,
        multimodal_fields: Any,
        num_generations: int,
        has_tool_images: bool = False,
    ) -> tuple[list[list[int]], Any]:
        if (
            self.use_vllm
        ):  # vLLM samples under TRL's regex constraint (vllm_structured_outputs_regex)
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
            items = self._items_of(completion_ids)
            ranks = list(range(num_generations)) * (len(items) // num_generations)
            self._record(items, ranks, num_generations)
            return completion_ids, logprobs
        g = num_generations
        unique = _distinct_prompts(prompt_ids, g)
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.sid_args.ds3_gather_for_generation,
            ) as model,
            torch.no_grad(),
        ):
            groups = self._rollout_items(model, unique, g)  # (prompts, G), best first
        flat = groups.flatten().tolist()
        self._record(flat, list(range(g)) * len(unique), g)
        eos = self.sid_tokenizer.eos_token_id
        tokens = self.trie.sid_token_ids
        return [[*tokens[i].tolist(), eos] for i in flat], None

    # --- rollouts

    def _rollout_items(self, model: Any, prompts: list[list[int]], g: int) -> torch.Tensor:
        args = self.sid_args
        exclude = self._group_exclusions(g)
        groups = self._rollout_groups(model, left_pad(prompts, self._pad_id), g, exclude)
        if bool((groups < 0).any()):  # cannot happen while G items stay allowed per prompt
            raise RuntimeError(f"a rollout found fewer than num_generations={g} allowed items")
        targets = self._batch_targets[::g] if self._batch_targets else None
        if targets is None:
            return groups
        self._log_targets(groups, targets)  # what the policy found, before any insertion
        return with_targets(groups, targets) if args.ensure_target else groups

    def _group_exclusions(self, g: int) -> list[list[int]] | None:
        """Per distinct prompt, the items its rollout may not hold (the ``exclude_index`` column:
        what the user already had, which evaluation never ranks). A prompt whose exclusions
        would leave fewer than G items keeps the whole catalog instead."""
        if self._batch_exclude is None:
            return None
        per_prompt = self._batch_exclude[::g]
        return [rows if self.trie.n_items - len(set(rows)) >= g else [] for rows in per_prompt]

    def _rollout_groups(
        self,
        model: Any,
        batch: dict[str, torch.Tensor],
        g: int,
        exclude: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """(prompts, G) catalog rows, best first, as the rollout mode draws them, none of them
        in the prompt's ``exclude`` list."""
        args = self.sid_args
        if args.rollout == "beam":
            out = generate_sids(
                model,
                self.sid_tokenizer,
                batch,
                self.trie,
                num_beams=g,
                top_k=g,
                max_prompt_tokens=batch["input_ids"].shape[1],
                exclude=exclude,
            )
            return out.items.cpu()
        n = g if args.rollout == "sample" else math.ceil(args.oversample * g)
        items, scores = self._sample(model, batch, n, exclude)
        if args.rollout == "sample":
            order = scores.argsort(dim=1, descending=True)  # rank = likelihood order in the group
            return items.gather(1, order)
        return _distinct_groups(items, scores, g)

    def _sample(
        self,
        model: Any,
        batch: dict[str, torch.Tensor],
        n: int,
        exclude: list[list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompts, n) constrained samples, none in the prompt's ``exclude`` list, and their
        sequence log-probabilities."""
        device = model.device
        banned = None
        if exclude is not None:
            mask = exclusion_mask(exclude, len(exclude), self.trie.n_items)
            banned = self.trie.banned_nodes(mask)
        processor = SidConstrainedLogitsProcessor(
            trie=self.trie,
            eos_token_id=self.sid_tokenizer.eos_token_id,
            inplace=False,
            banned_nodes=banned,
        )
        out = model.generate(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            logits_processor=LogitsProcessorList([processor]),
            do_sample=True,
            temperature=self.sid_args.temperature,
            top_k=0,
            top_p=1.0,
            num_return_sequences=n,
            max_new_tokens=self.trie.levels + 1,
            pad_token_id=self._pad_id,
            eos_token_id=self.sid_tokenizer.eos_token_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        levels = self.trie.levels
        generated = out.sequences[:, batch["input_ids"].shape[1] :]
        items = self.trie.item_index(generated[:, :levels])
        if bool((items < 0).any()):
            raise RuntimeError("constrained sampling produced a SID outside the catalog")
        logp = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        scores = logp[:, :levels].sum(1)
        rows = batch["input_ids"].shape[0]
        return items.view(rows, n).cpu(), scores.view(rows, n).float().cpu()

    # --- bookkeeping

    @property
    def _pad_id(self) -> int:
        tok = self.sid_tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def _items_of(self, completion_ids: list[list[int]]) -> list[int]:
        levels = self.trie.levels
        sids = torch.tensor([(ids + [-1] * levels)[:levels] for ids in completion_ids])
        return self.trie.item_index(sids).tolist()

    def _log_targets(self, groups: torch.Tensor, targets: list[int]) -> None:
        """The share of groups holding their target and its mean 1-based place where it is
        (groups without a target left out)."""
        target = torch.tensor(targets)
        has = target != NO_TARGET
        if not bool(has.any()):
            return
        found = groups[has] == target[has].unsqueeze(1)
        hit = found.any(dim=1)
        model: Any = self.model
        metrics = self._metrics["train" if model.training else "eval"]
        metrics["rollout/target_in_group"].append(float(hit.float().mean()))
        if bool(hit.any()):  # TRL averages what was appended since the last log
            metrics["rollout/target_rank"].append(
                float(found[hit].int().argmax(1).float().mean() + 1)
            )

    def _record(self, items: list[int], ranks: list[int], g: int) -> None:
        """Keep the rollout's items and ranks for the rewards; log group diversity."""
        self._rollout = {"items": items, "ranks": ranks}
        groups = torch.tensor(items).view(-1, g)
        first_codes = self.trie.sid_token_ids[groups.clamp(min=0), 0]
        model: Any = self.model
        metrics = self._metrics["train" if model.training else "eval"]
        metrics["rollout/distinct_items"].append(_distinct_per_row(groups) / g)
        metrics["rollout/distinct_first_codes"].append(_distinct_per_row(first_codes))
        metrics["rollout/invalid_rate"].append(float((groups < 0).float().mean()))


def trie_allowed(trie: SidTrie, completion: torch.Tensor, vocab: int, eos: int) -> torch.Tensor:
    """(rows, K) completion token ids → (rows, K, vocab) bool: at each place, the tokens the
    constrained decoder could emit after the completion so far (the trie's children of that
    prefix; EOS only after a whole SID or after anything that is no SID prefix)."""
    trie = trie.to(completion.device)
    rows, places = completion.shape
    allowed = torch.zeros(rows, places, vocab, dtype=torch.bool, device=completion.device)
    for place in range(places):
        node = trie.walk(completion[:, :place])  # no columns: the root
        allowed[:, place].scatter_(1, trie.allowed_next(node, eos), True)
    return allowed


def vocabulary_logps(
    logits: torch.Tensor, completion: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of ``completion`` (rows, K) under ``logits`` (rows, K, vocab), and
    each place's entropy, over the tokens whose logit is not -inf: the whole vocabulary (what
    TRL's fused LM head computes) unless the caller masked some out."""
    logp = logits.log_softmax(-1)
    token_logp = logp.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    return token_logp, -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)  # masked: 0, not 0 x -inf


def trie_masked_logps(
    trie: SidTrie, logits: torch.Tensor, completion: torch.Tensor, eos: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of ``completion`` (rows, K) under ``logits`` (rows, K, vocab)
    renormalized over the trie-allowed tokens of each place, and each place's entropy over them.
    A token the trie does not allow there (padding after EOS, masked out of TRL's loss) is
    scored as if it were allowed, so its log-prob stays finite."""
    allowed = trie_allowed(trie, completion, logits.shape[-1], eos)
    allowed.scatter_(2, completion.unsqueeze(-1), True)
    return vocabulary_logps(logits.masked_fill(~allowed, float("-inf")), completion)


def _distinct_prompts(prompt_ids: list[list[int]], g: int) -> list[list[int]]:
    """The distinct prompts of a batch where each arrives as G consecutive copies."""
    if len(prompt_ids) % g:
        raise ValueError(f"{len(prompt_ids)} prompts cannot form groups of num_generations={g}")
    unique = prompt_ids[::g]
    for i, prompt in enumerate(unique):
        if any(prompt_ids[i * g + j] != prompt for j in range(1, g)):
            raise ValueError(
                "prompts must arrive as num_generations consecutive copies (TRL's sampler)"
            )
    return unique


def _distinct_groups(items: torch.Tensor, scores: torch.Tensor, g: int) -> torch.Tensor:
    """Per row: the distinct sampled items, most likely first, cut to G; rows with fewer than G
    distinct items are topped up by repeating them (best first)."""
    groups = []
    for row in range(items.shape[0]):
        order = scores[row].argsort(descending=True)
        distinct = list(dict.fromkeys(items[row, order].tolist()))
        groups.append((distinct * math.ceil(g / len(distinct)))[:g])
    return torch.tensor(groups, dtype=torch.int64)


def with_targets(groups: torch.Tensor, targets: list[int]) -> torch.Tensor:
    """``groups`` (prompts, G) where each row that misses its target has it in the last place
    (MiniOneRec's ``add_gt``); rows holding it, or without one, are unchanged, so distinct rows
    stay distinct."""
    out = groups.clone()
    target = torch.tensor(targets, dtype=out.dtype)
    missing = ~(out == target.unsqueeze(1)).any(dim=1) & (target != NO_TARGET)
    out[missing, -1] = target[missing]
    return out


def _distinct_per_row(groups: torch.Tensor) -> float:
    return float(sum(len(set(row.tolist())) for row in groups) / max(1, len(groups)))
