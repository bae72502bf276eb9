"""Configuration of :class:`models.grpo_trainer.SidGRPOTrainer`: TRL's ``GRPOConfig`` plus the
rollout options of constrained SID generation."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

ROLLOUTS = ("beam", "sample", "dynamic")


@dataclass
class SidGRPOConfig(GRPOConfig):
    """Everything TRL's ``GRPOConfig`` offers (loss_type, importance_sampling_level for GSPO,
    beta, num_iterations, epsilon / epsilon_high, scale_rewards, reward_weights, ...) and:"""

    # --- rollouts (MiniOneRec / ReRe samplers; all use the SID-trie logits processor)
    rollout: str = field(
        default="beam",
        metadata={
            "help": "beam: each group is the G best distinct catalog items by constrained beam search "
            "(deterministic: the update is an advantage-weighted ranking step, not an on-policy "
            "sample). sample: G constrained temperature samples (items may repeat). dynamic: "
            "oversample constrained samples and keep G distinct items."
        },
    )
    oversample: float = field(
        default=1.5,
        metadata={"help": "dynamic: samples drawn per prompt as a multiple of num_generations."},
    )
    ensure_target: bool = field(
        default=False,
        metadata={
            "help": "beam / dynamic: replace the last item of a group that misses the target by "
            "it (every group then carries the target's signal; not with rollout sample)."
        },
    )

    positive_only: bool = field(
        default=False,
        metadata={
            "help": "Clamp the advantages at 0 from below: completions scored below their "
            "group's mean no longer get a push down, only those above it a push up."
        },
    )
    trie_mask: bool = field(
        default=False,
        metadata={
            "help": "Normalize the policy's (and the reference model's) per-token log-probs over "
            "the tokens the SID trie allows at that place (the children of the SID prefix so "
            "far, EOS after a whole SID) instead of the whole vocabulary: the loss then moves "
            "probability only between catalog items, never onto tokens the constrained decoder "
            "cannot emit."
        },
    )

    def __post_init__(self) -> None:
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"rollout must be one of {ROLLOUTS}, got {self.rollout!r}")
        if self.oversample < 1.0:
            raise ValueError(f"oversample must be >= 1 (a multiple of G), got {self.oversample}")
        check_vllm(use_vllm=self.use_vllm, rollout=self.rollout)
        check_ensure_target(ensure_target=self.ensure_target, rollout=self.rollout)
        # TRL checks that the generation batch holds whole groups of num_generations completions
        super().__post_init__()


def check_ensure_target(*, ensure_target: bool, rollout: str) -> None:
    """``ensure_target`` edits groups of distinct items (beam, dynamic); a ``sample`` group is the
    policy's own draws, where an inserted target would be no sample at all."""
    if ensure_target and rollout == "sample":
        raise ValueError(
            "ensure_target puts the target into a group of distinct items and needs rollout beam or "
            "dynamic; rollout 'sample' keeps the policy's own draws: set ensure_target false or "
            "rollout beam / dynamic"
        )


def check_vllm(*, use_vllm: bool, rollout: str) -> None:
    """vLLM rollouts need rollout ``sample`` and a CUDA GPU (ValueError saying which is missing)."""
    if not use_vllm:
        return
    if rollout != "sample":
        raise ValueError(
            "vLLM rollouts are constrained temperature samples (rollout 'sample'); beam and "
            "dynamic rollouts run on transformers' generate: set use_vllm false or rollout 'sample'"
        )
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "use_vllm needs a CUDA GPU: vLLM rollouts are for GPU workers "
            "(pip install -e '.[gpu]'); set use_vllm false on CPU machines"
        )


def check_group_size(num_generations: int, n_items: int) -> None:
    """A group holds ``num_generations`` distinct catalog items: no more than the catalog has."""
    if num_generations > n_items:
        raise ValueError(
            f"num_generations ({num_generations}) exceeds the catalog ({n_items} items): "
            "a group cannot hold that many distinct valid items; lower it"
        )
