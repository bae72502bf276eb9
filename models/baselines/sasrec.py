"""SASRec: next-item recommendation with a causal self-attention encoder.

Kang & McAuley 2018, "Self-Attentive Sequential Recommendation" (ICDM): item embedding +
learned positional embedding, ``blocks`` pre-norm Transformer blocks with causal attention,
dropout and a final layer norm; an item's score is the last hidden state · its (tied)
embedding. Two deliberate departures from the paper, both common in later work:

- the loss is full-softmax cross-entropy over the whole catalog at every position, instead
  of binary cross-entropy against one sampled negative (faster to converge, and it trains
  the same full-catalog ranking the evaluation measures);
- train rows keep only ``split.max_history`` items of history, so each user's training
  sequence is rebuilt from them (:func:`models.baselines.train_sequences`) and cut into
  windows of ``max_len`` transitions, newest first; every position of a window predicts
  its next item. Evaluation feeds each valid/test row's history exactly as the split file
  gives it (the same input every model of this project sees). The baselines stage sets
  ``max_len`` to ``split.max_history`` by default, so training windows are as long as the
  histories the model is fed.

A trained model is saved as a folder (:func:`save_sasrec`: ``model.pt`` + ``config.json``)
and loaded back, checked against the current catalog, with :func:`load_sasrec`. Training can
keep its whole state in a resume file after every epoch (``train_sasrec(..., resume=path)``):
a run stopped part-way (a preempted worker, a killed process) goes on from its last epoch and
ends where an uninterrupted run would.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import pickle
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from models.baselines import (
    catalog_index,
    check_split,
    encode_histories,
    encode_targets,
    train_sequences,
)
from models.checks import require
from models.metrics import DEFAULT_KS, rank_metrics, topk_from_scores
from sidrec.io import atomic_path
from sidrec.progress import ProgressBar

logger = logging.getLogger(__name__)


LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class SASRecConfig:
    """Architecture, optimization and early-stopping options (defaults: the paper's, tuned for CPU)."""

    # --- architecture (paper, Sec. III)
    hidden: int = 64
    """Embedding and hidden size d (item, position and every block)."""
    blocks: int = 2
    """Self-attention blocks b (the paper's default is 2)."""
    heads: int = 2
    """Attention heads per block (the paper uses 1; ``hidden`` must be divisible by it)."""
    dropout: float = 0.2
    """Dropout on embeddings, attention weights and feed-forward outputs (paper: 0.2 on ML-1M)."""
    max_len: int = 50
    """Longest input n (paper: 50; 200 on ML-1M): training windows hold this many transitions, and
    histories are cut to their last ``max_len`` items (split histories hold at most split.max_history)."""
    # --- optimization
    lr: float = 2e-3
    """Adam learning rate (the paper: 0.001; 0.002 reached a better validation NDCG@10 with the
    full-softmax loss before patience stopped it)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW); 0 = plain Adam as in the paper."""
    batch_size: int = 128
    """Training windows per mini-batch (paper: 128)."""
    max_epochs: int = 200
    """Upper bound on passes over the training windows."""
    lr_schedule: str = "constant"
    """"constant", or "cosine": the rate falls along a half cosine from ``lr`` at the first
    step to 0 at the end of ``max_epochs``."""
    # --- checkpoint selection
    patience: int = 20
    """Stop after this many epochs without a better validation NDCG@10; the best epoch is restored.
    The validation curve has plateaus that a short patience stops on (docs/benchmarks.md,
    experiment index: "SASRec at patience 5")."""
    eval_every: int = 1
    """Epochs between validation runs (the last epoch is always evaluated)."""
    # --- reproducibility and hardware
    seed: int = 0
    """Seeds Python, numpy, torch (initialization, dropout) and window shuffling."""
    device: str = "cpu"
    """Torch device for training and inference, e.g. "cpu" or "cuda"."""

    def __post_init__(self) -> None:
        checks = [
            ("hidden", self.hidden >= 1, ">= 1"),
            ("blocks", self.blocks >= 1, ">= 1"),
            ("heads", self.heads >= 1 and self.hidden % self.heads == 0, "a divisor of hidden"),
            ("dropout", 0.0 <= self.dropout < 1.0, "in [0, 1)"),
            ("max_len", self.max_len >= 1, ">= 1"),
            ("lr", self.lr > 0, "> 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("max_epochs", self.max_epochs >= 1, ">= 1"),
            ("lr_schedule", self.lr_schedule in LR_SCHEDULES, f"one of {LR_SCHEDULES}"),
            ("patience", self.patience >= 1, ">= 1"),
            ("eval_every", self.eval_every >= 1, ">= 1"),
            ("seed", self.seed >= 0, ">= 0"),
        ]
        require(self, checks)
        try:
            torch.device(self.device)
        except RuntimeError as exc:
            raise ValueError(f"SASRecConfig.device {self.device!r} is not a torch device") from exc


class SASRec(nn.Module):
    """Causal self-attention over item sequences; scores the full catalog (Kang & McAuley 2018)."""

    def __init__(self, *, item_ids: Sequence[str], config: SASRecConfig):
        super().__init__()
        self.item_ids = list(item_ids)
        self.index = catalog_index(self.item_ids)
        self.config = config
        d = config.hidden
        self.item_emb = nn.Embedding(len(self.item_ids) + 1, d, padding_idx=0)
        """Row 0 is padding; item index i lives in row i + 1."""
        self.pos_emb = nn.Embedding(config.max_len, d)
        self.emb_dropout = nn.Dropout(config.dropout)
        block = nn.TransformerEncoderLayer(
            d_model=d,
            nhead=config.heads,
            dim_feedforward=d,  # the paper's point-wise feed-forward keeps width d
            dropout=config.dropout,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            block, config.blocks, norm=nn.LayerNorm(d), enable_nested_tensor=False
        )
        nn.init.normal_(self.item_emb.weight, std=d**-0.5)
        nn.init.normal_(self.pos_emb.weight, std=d**-0.5)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
        self.best_epoch: int | None = None
        """The training epoch these weights come from (set by :func:`train_sasrec`, kept by
        :func:`save_sasrec`); None for an untrained model."""

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def forward(
        self,
        seqs: torch.Tensor,
        positions: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) embedding rows (0 = padding, left-padded, L <= max_len) → (B, L, hidden).

        Positions are counted from the right, so a row's last item always sits at position
        max_len - 1 however long the batch is. A packed batch (:func:`_pack`) passes each
        column's ``positions`` and ``segments`` (B, L): the window a column belongs to, 0 for
        padding; a column then attends only to earlier columns of its own window, so each
        window computes what it would alone in its own left-padded row.
        """
        length = seqs.shape[1]
        if length > self.config.max_len:
            raise ValueError(f"sequences of length {length} exceed max_len={self.config.max_len}")
        pad = seqs == 0
        if positions is None:
            positions = torch.arange(
                self.config.max_len - length, self.config.max_len, device=seqs.device
            )
        x = self.item_emb(seqs) * math.sqrt(self.config.hidden) + self.pos_emb(positions)
        x = self.emb_dropout(x).masked_fill(pad[..., None], 0.0)
        return self.encoder(x, mask=self._attention_mask(pad, segments))

    def _attention_mask(self, pad: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
        """(B·heads, L, L) bool, True = may not attend: future items, padding keys and (in a
        packed batch) other windows' keys.

        A padding query may attend to itself, so no row is fully masked (that would give NaN);
        real queries never see padding (it only precedes them).
        """
        length = pad.shape[1]
        future = torch.ones(length, length, dtype=torch.bool, device=pad.device).triu(1)
        itself = torch.eye(length, dtype=torch.bool, device=pad.device)
        blocked = future | (pad[:, None, :] & ~itself)
        if segments is not None:
            blocked |= segments[:, None, :] != segments[:, :, None]
        return blocked.repeat_interleave(self.config.heads, dim=0)

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., hidden) states → (..., n_items) scores against the tied item embeddings."""
        return hidden @ self.item_emb.weight[1:].T

    @contextmanager
    def inference(self) -> Iterator[None]:
        """No gradients and no dropout for the block; the previous train/eval mode is restored."""
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.train(was_training)


# --- inference


def _pad_left(histories: Sequence[Sequence[int]], max_len: int) -> torch.Tensor:
    """Last ``max_len`` items of each history as embedding rows (index + 1), left-padded with 0."""
    width = max(1, min(max_len, max((len(h) for h in histories), default=1)))
    out = np.zeros((len(histories), width), dtype=np.int64)
    for row, history in enumerate(histories):
        tail = list(history)[-width:]
        if tail:
            out[row, width - len(tail) :] = np.asarray(tail, dtype=np.int64) + 1
    return torch.from_numpy(out)


def recommend(
    model: SASRec,
    histories: Sequence[Sequence[Any]],
    k: int,
    *,
    exclude: Sequence[Sequence[Any]] | None = None,
    batch_size: int = 512,
) -> np.ndarray:
    """(n, k) int64 top-k item indices over the full catalog for each history.

    ``histories`` hold item_id strings or item indices, oldest first; only the last
    ``max_len`` items are read. ``exclude`` (item ids or indices per row, e.g. everything the
    user has seen) drops items from that row's ranking; rows left with fewer than k items
    end in -1. Nothing is excluded by default: re-consumption is a valid next item in general.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    encoded = encode_histories(histories, model.index, "histories")
    banned = None if exclude is None else encode_histories(exclude, model.index, "exclusions")
    device = next(model.parameters()).device
    # batches of similar lengths pad less; each row's ranking does not depend on its batch
    order = np.argsort([min(len(h), model.config.max_len) for h in encoded], kind="stable")
    out = np.empty((len(encoded), k), dtype=np.int64)
    with model.inference():
        for start in range(0, len(encoded), batch_size):
            rows = order[start : start + batch_size]
            batch = [encoded[r] for r in rows]
            hidden = model(_pad_left(batch, model.config.max_len).to(device))[:, -1]
            seen = None if banned is None else [banned[r] for r in rows]
            out[rows] = topk_from_scores(model.scores(hidden), k, exclude=seen)
    return out


def evaluate_sasrec(
    model: SASRec, split: pd.DataFrame, *, ks: Sequence[int] = DEFAULT_KS, name: str = "split"
) -> dict[str, float]:
    """HR@K and NDCG@K of ``model`` on a split's (history → target) rows, full-catalog ranking."""
    check_split(split, name)
    targets = encode_targets(list(split["target"]), model.index, f"{name} targets")
    topk = recommend(model, list(split["history"]), max(ks))
    return rank_metrics(topk, targets, ks)


# --- training


class SASRecTrainResult(NamedTuple):
    model: SASRec
    """The checkpoint with the best validation NDCG@10, in eval mode."""
    best_epoch: int
    best_valid_ndcg10: float
    history: list[dict[str, float]]
    """One record per evaluation: epoch, mean training loss, the learning rate of the epoch's
    first step, and every validation hr@K / ndcg@K."""
    windows: int
    """Training windows (of at most ``max_len`` transitions) the train split was cut into."""
    resumed_after: int = 0
    """The epoch a resume file took the run up to (0: trained from the start)."""


def _windows(sequences: list[list[int]], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut sequences into windows of <= max_len transitions, newest first.

    Returns inputs (N, max_len) of embedding rows (0 = padding) and targets (N, max_len) of
    item indices (-1 = no loss), both left-padded.
    """
    pieces = [
        seq[max(0, end - max_len) : end + 1]
        for seq in sequences
        for end in range(len(seq) - 1, 0, -max_len)
    ]
    inputs = np.zeros((len(pieces), max_len), dtype=np.int64)
    targets = np.full((len(pieces), max_len), -1, dtype=np.int64)
    for row, piece in enumerate(pieces):
        items = np.asarray(piece, dtype=np.int64)
        inputs[row, max_len - len(items) + 1 :] = items[:-1] + 1
        targets[row, max_len - len(items) + 1 :] = items[1:]
    return torch.from_numpy(inputs), torch.from_numpy(targets)


def _seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


class _Packed(NamedTuple):
    """A batch of windows packed into rows of ``max_len`` columns (:func:`_pack`)."""

    inputs: torch.Tensor
    """(R, max_len) embedding rows, 0 = padding."""
    targets: torch.Tensor
    """(R, max_len) item indices, -1 = no loss."""
    positions: torch.Tensor
    """(R, max_len) each column's position: a window of length l holds max_len - l … max_len - 1."""
    segments: torch.Tensor
    """(R, max_len) which window of its row a column belongs to (1, 2, …), 0 = padding."""


def _pack(inputs: torch.Tensor, targets: torch.Tensor) -> _Packed:
    """Place the windows of one batch side by side in as few rows as first-fit finds.

    A left-padded window of length l spends max_len - l columns on padding; most of a
    MovieLens-1M batch is padding. Packed, each window keeps its own positions and attends
    only to itself (:meth:`SASRec.forward`), so the loss and its gradient are those of the
    unpacked batch, in fewer rows.
    """
    width = inputs.shape[1]
    lengths = (inputs != 0).sum(1).tolist()
    rows: list[list[int]] = []
    free: list[int] = []
    for window in sorted(range(len(lengths)), key=lambda w: -lengths[w]):
        row = next((r for r, room in enumerate(free) if room >= lengths[window]), len(rows))
        if row == len(rows):
            rows.append([])
            free.append(width)
        rows[row].append(window)
        free[row] -= lengths[window]
    packed = _Packed(
        inputs.new_zeros(len(rows), width),
        targets.new_full((len(rows), width), -1),
        inputs.new_zeros(len(rows), width),
        inputs.new_zeros(len(rows), width),
    )
    for row, windows in enumerate(rows):
        end = width
        for number, window in enumerate(windows, start=1):
            length = lengths[window]
            cols = slice(end - length, end)
            packed.inputs[row, cols] = inputs[window, width - length :]
            packed.targets[row, cols] = targets[window, width - length :]
            packed.positions[row, cols] = torch.arange(width - length, width)
            packed.segments[row, cols] = number
            end -= length
    return packed


def _train_epoch(
    model: SASRec,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> float:
    """One shuffled pass over the windows, each batch packed (:func:`_pack`), ``schedule``
    stepped after every optimizer step; returns the mean cross-entropy per batch."""
    model.train()
    device = next(model.parameters()).device
    losses = []
    for batch in torch.randperm(len(inputs), generator=generator).split(model.config.batch_size):
        packed = _Packed(*(t.to(device) for t in _pack(inputs[batch], targets[batch])))
        keep = packed.targets >= 0
        hidden = model(packed.inputs, packed.positions, packed.segments)
        loss = F.cross_entropy(model.scores(hidden[keep]), packed.targets[keep])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
        losses.append(loss.item())
    return float(np.mean(losses))


def _lr_schedule(
    optimizer: torch.optim.Optimizer, config: SASRecConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """None for a constant rate; for "cosine", torch's cosine annealing from ``lr`` at the
    first step to 0 at the end of ``max_epochs`` (training never steps past it)."""
    if config.lr_schedule == "constant":
        return None
    total = config.max_epochs * steps_per_epoch
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total, eta_min=0.0)


def _validation_data(
    valid: pd.DataFrame, index: dict[str, int]
) -> tuple[list[list[int]], np.ndarray]:
    check_split(valid, "valid")
    histories = encode_histories(list(valid["history"]), index, "valid histories")
    return histories, encode_targets(list(valid["target"]), index, "valid targets")


def train_sasrec(
    train: pd.DataFrame,
    valid: pd.DataFrame,
    item_ids: Sequence[str],
    config: SASRecConfig,
    *,
    exclude: Sequence[Sequence[str]] | None = None,
    progress: bool = True,
    resume: Path | None = None,
) -> SASRecTrainResult:
    """Train SASRec on the train split; early-stop on, and restore the best, validation NDCG@10.

    ``exclude``: per ``valid`` row, the items its ranking leaves out (the user's seen items,
    as evaluate ranks under ``evaluate.exclude_seen``), so the checkpoint is chosen on the
    metric it is judged by.

    ``resume``: a file that holds the training state after every epoch (written atomically;
    see :class:`_ResumeState`). Where it already holds a run of the same settings, catalog
    and data, training goes on after its last epoch, with the random streams it had, and
    ends as the uninterrupted run would; a file of another run, or one that cannot be read,
    is logged and replaced. The caller removes it once the result is stored."""
    index = catalog_index(item_ids)
    sequences = encode_histories(train_sequences(train), index, "train sequences")
    inputs, targets = _windows(sequences, config.max_len)
    if len(inputs) == 0:
        raise ValueError("the train split yields no transitions (every sequence has one item)")
    valid_histories, valid_targets = _validation_data(valid, index)
    generator = _seed_everything(config.seed)
    model = SASRec(item_ids=item_ids, config=config).to(config.device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=config.weight_decay
    )
    steps_per_epoch = math.ceil(len(inputs) / config.batch_size)
    schedule = _lr_schedule(optimizer, config, steps_per_epoch)
    run = _ResumeState(
        fingerprint=_run_fingerprint(
            config, item_ids, (inputs, targets), valid_histories, valid_targets, exclude
        )
    )
    live = _Training(model, optimizer, schedule, generator)
    if resume is not None:
        run = run.restored(resume, live)
    resumed_after = run.epoch
    last = run.epoch if run.done else config.max_epochs
    bar = ProgressBar(
        range(run.epoch + 1, last + 1),
        desc="sasrec",
        total=config.max_epochs,
        initial=run.epoch,
        disable=not progress,
    )
    for epoch in bar:
        lr = optimizer.param_groups[0]["lr"]
        loss = _train_epoch(model, inputs, targets, optimizer, generator, schedule)
        run.epoch = epoch
        if epoch % config.eval_every == 0 or epoch == config.max_epochs:
            topk = recommend(model, valid_histories, max(DEFAULT_KS), exclude=exclude)
            record = {
                "epoch": epoch,
                "loss": loss,
                "lr": lr,
                **rank_metrics(topk, valid_targets, DEFAULT_KS),
            }
            run.history.append(record)
            bar.set_postfix(loss=f"{loss:.4f}", ndcg10=f"{record['ndcg@10']:.4f}")
            if record["ndcg@10"] > run.best["ndcg@10"]:
                run.best, run.best_state = record, copy.deepcopy(model.state_dict())
            elif epoch - run.best["epoch"] >= config.patience:
                run.done = True
        run.done = run.done or epoch == config.max_epochs
        if resume is not None:
            run.save(resume, live)
        if run.done:
            break
    bar.close()
    best, history = run.best, run.history
    model.load_state_dict(run.best_state)
    model.best_epoch = int(best["epoch"])
    model.eval()
    logger.info(
        "SASRec: %d windows from %d sequences; best epoch %d of %d run, valid NDCG@10 %.4f",
        len(inputs),
        len(sequences),
        int(best["epoch"]),
        int(history[-1]["epoch"]),
        best["ndcg@10"],
    )
    return SASRecTrainResult(
        model, int(best["epoch"]), best["ndcg@10"], history, len(inputs), resumed_after
    )


RESUME_FORMAT = 1
"""Version of the resume file's layout; a file of another version is not resumed."""


def _run_fingerprint(
    config: SASRecConfig,
    item_ids: Sequence[str],
    windows: tuple[torch.Tensor, torch.Tensor],
    valid_histories: list[list[int]],
    valid_targets: np.ndarray,
    exclude: Sequence[Sequence[str]] | None,
) -> str:
    """SHA-256 of everything a training run's course depends on but the hardware: the
    config (without ``device``), the catalog, the training windows and the validation rows."""
    digest = hashlib.sha256()
    options = {k: v for k, v in dataclasses.asdict(config).items() if k != "device"}
    digest.update(json.dumps(options, sort_keys=True).encode())
    digest.update(json.dumps([str(i) for i in item_ids]).encode())
    for tensor in windows:
        digest.update(tensor.numpy().tobytes())
    digest.update(json.dumps([[int(i) for i in h] for h in valid_histories]).encode())
    digest.update(np.asarray(valid_targets, dtype=np.int64).tobytes())
    seen = None if exclude is None else [sorted(str(i) for i in row) for row in exclude]
    digest.update(json.dumps(seen).encode())
    return digest.hexdigest()


class _Training(NamedTuple):
    """The objects whose states a resume file holds besides :class:`_ResumeState`."""

    model: SASRec
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler | None
    generator: torch.Generator


@dataclass
class _ResumeState:
    """A training run between two epochs: what the resume file holds beside the states of
    the :class:`_Training` objects (:meth:`save`)."""

    fingerprint: str
    """:func:`_run_fingerprint` of the run; a file with another one is not resumed."""
    epoch: int = 0
    """Epochs finished."""
    done: bool = False
    """Early stopping or ``max_epochs`` ended the run; resuming only restores its best."""
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    best: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"epoch": 0, "ndcg@10": -1.0}
    )
    best_state: dict[str, Any] = dataclasses.field(default_factory=dict)

    def save(
        self,
        path: Path,
        live: _Training,
    ) -> None:
        """Write the run's whole state to ``path`` (atomically: a reader sees the previous
        epoch's file or this one)."""
        state = {
            "format": RESUME_FORMAT,
            **dataclasses.asdict(self),
            "model": live.model.state_dict(),
            "optimizer": live.optimizer.state_dict(),
            "schedule": None if live.schedule is None else live.schedule.state_dict(),
            "shuffle_rng": live.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            torch.save(state, tmp)

    def restored(
        self,
        path: Path,
        live: _Training,
    ) -> _ResumeState:
        """The run ``path`` holds, its states loaded into ``live``, where it is this run (same
        fingerprint) after at least one epoch; else ``self`` (a fresh start)."""
        if not path.exists():
            return self
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            same = (
                state.get("format") == RESUME_FORMAT
                and state.get("fingerprint") == self.fingerprint
            )
        except (RuntimeError, OSError, EOFError, pickle.UnpicklingError, AttributeError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            logger.warning("SASRec: %s cannot be read (%s); training from the start", path, reason)
            return self
        if not same:
            logger.warning(
                "SASRec: %s holds a run of other settings or data; training from the start", path
            )
            return self
        live.model.load_state_dict(state["model"])
        live.optimizer.load_state_dict(state["optimizer"])
        if live.schedule is not None:
            live.schedule.load_state_dict(state["schedule"])
        live.generator.set_state(state["shuffle_rng"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        run = _ResumeState(**{f.name: state[f.name] for f in dataclasses.fields(_ResumeState)})
        logger.info(
            "SASRec: resuming from %s after epoch %d (best so far: epoch %d, NDCG@10 %.4f)",
            path,
            run.epoch,
            int(run.best["epoch"]),
            run.best["ndcg@10"],
        )
        return run


# --- saving and loading

WEIGHTS_FILE = "model.pt"
CONFIG_FILE = "config.json"


def save_sasrec(model: SASRec, folder: Path) -> None:
    """Write ``model`` into ``folder`` (created if needed): ``model.pt`` holds its state_dict,
    ``config.json`` its :class:`SASRecConfig` fields, catalog (item_ids in index order) and
    best epoch. Callers that need the folder replaced atomically write into a staging folder
    (``sidrec.io.AtomicOutputs.folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, folder / WEIGHTS_FILE)
    record = {
        "config": dataclasses.asdict(model.config),
        "best_epoch": model.best_epoch,
        "item_ids": model.item_ids,
    }
    (folder / CONFIG_FILE).write_text(json.dumps(record, indent=1) + "\n")


def load_sasrec(folder: Path, *, item_ids: Sequence[str], device: str = "cpu") -> SASRec:
    """The model :func:`save_sasrec` wrote into ``folder``, in eval mode on ``device``.

    Raises ``ValueError`` naming ``folder`` when it is missing or unreadable, or when the model
    was trained on another catalog than ``item_ids`` (its item rows would score the wrong items).
    """
    weights, config_file = folder / WEIGHTS_FILE, folder / CONFIG_FILE
    missing = [p.name for p in (weights, config_file) if not p.is_file()]
    if missing:
        raise ValueError(f"{folder}: no trained SASRec model ({', '.join(missing)} not found)")
    try:
        record = json.loads(config_file.read_text())
        config = dataclasses.replace(SASRecConfig(**record["config"]), device=device)
        saved_ids = [str(i) for i in record["item_ids"]]
        best_epoch = record.get("best_epoch")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{config_file}: not a SASRec config ({type(exc).__name__}: {exc})"
        ) from None
    _check_same_catalog(folder, saved_ids, [str(i) for i in item_ids])
    model = SASRec(item_ids=saved_ids, config=config)
    try:
        state = torch.load(weights, map_location=device, weights_only=True)
        model.load_state_dict(state)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{weights}: cannot load the SASRec weights ({reason})") from None
    model.best_epoch = None if best_epoch is None else int(best_epoch)
    return model.to(device).eval()


def _check_same_catalog(folder: Path, saved: list[str], current: list[str]) -> None:
    if saved == current:
        return
    row = next((i for i, (a, b) in enumerate(zip(saved, current, strict=False)) if a != b), None)
    where = (
        f"row {row} holds {saved[row]!r} there, {current[row]!r} now"
        if row is not None
        else "one catalog extends the other"
    )
    raise ValueError(
        f"{folder}: the SASRec model was trained on another catalog ({len(saved)} items there, "
        f"{len(current)} now; {where})"
    )


def load_baseline(folder: Path, *, item_ids: Sequence[str]) -> SASRec:
    """:func:`load_sasrec` for the stages that read the ``baselines`` stage's model: a missing
    or stale model becomes an :class:`~sidrec.errors.InputError` saying which command writes it."""
    from sidrec.errors import InputError

    try:
        return load_sasrec(folder, item_ids=item_ids)
    except ValueError as exc:
        raise InputError(f"{exc}; run `sidrec baselines` to train it on the current data") from None
