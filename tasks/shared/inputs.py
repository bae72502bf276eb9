"""Stage inputs several stages read the same way: the catalog with its SID map, the item texts
SFT teaches, each user's recent rows, the shared recommender around a trained model folder, and
SASRec as SFT's teacher (``sft.distill``, also replayed by GRPO's ``grpo.sft_anchor``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from models.baselines import train_sequences
from models.recommender import SidRecommender
from models.sid import SidMap, read_sid_map, sid_tokens
from sidrec.config import Settings
from sidrec.errors import ConfigError, InputError
from sidrec.io import read_table
from sidrec.schemas import ITEMS, SPLIT
from tasks.shared.texts import render_texts

if TYPE_CHECKING:
    from models.baselines.sasrec import SASRec


def load_catalog_and_map(settings: Settings) -> tuple[pd.DataFrame, SidMap]:
    """The catalog and its SID map, checked against each other (a clear error before training)."""
    paths = settings.paths
    items = read_table(paths.validated("items"), ITEMS, "validated items")
    sid_map = read_sid_map(paths.sid_map)
    missing = [i for i in items["item_id"] if i not in sid_map]
    extra = len(set(sid_map) - set(items["item_id"]))
    if missing or extra:
        raise InputError(
            f"SID map does not match the catalog: {len(missing)} catalog item(s) without a SID, "
            f"{extra} SID(s) for unknown items; re-run `sidrec sids`",
            path=paths.sid_map,
            values=missing[:5],
        )
    return items, sid_map


def item_texts(settings: Settings, items: pd.DataFrame) -> dict[str, str]:
    """item id → the text the SFT model learns for it (``sft.item_text``): the alignment pairs,
    the tiny tokenizer's corpus and GRPO's title prompts all read it."""
    texts = render_texts(items, settings.sft.item_text, "sft.item_text")
    return dict(zip(items["item_id"], texts, strict=True))


def read_split(settings: Settings, name: str) -> pd.DataFrame:
    """One split (``train``, ``valid`` or ``test``), checked against its schema."""
    return read_table(settings.paths.split(name), SPLIT, f"{name} split")


def recent_rows(split: pd.DataFrame, per_user: int | None) -> pd.DataFrame:
    """Each user's most recent ``per_user`` rows (all when None)."""
    if per_user is None:
        return split
    return (
        split.sort_values("timestamp", kind="stable").groupby("user_id", sort=False).tail(per_user)
    )


def sequence_windows(
    train: pd.DataFrame, window: int, stride: int | None = None
) -> list[list[str]]:
    """Each user's train sequence cut into windows of up to ``window`` items, newest first, the
    next window ending ``stride`` items before (null: ``window``, so every train interaction is
    in exactly one window); a user's windows end with the first one that reaches the oldest
    item."""
    step = stride or window
    windows = []
    for sequence in train_sequences(train):
        for end in range(len(sequence), 0, -step):
            windows.append(sequence[max(0, end - window) : end])
            if end <= window:
                break
    return windows


def without_recent_rows(train: pd.DataFrame, per_user: int) -> pd.DataFrame:
    """The train rows less each user's ``per_user`` most recent ones (a user keeps its oldest row
    at least); the rest still chain into one sequence per user, its newest items cut off."""
    if per_user == 0:
        return train
    ordered = train.sort_values("timestamp", kind="stable")
    from_newest = ordered.groupby("user_id", sort=False).cumcount(ascending=False)
    rows = ordered.groupby("user_id", sort=False)["user_id"].transform("size")
    keep = from_newest >= per_user
    keep |= from_newest == rows - 1  # the oldest row of a user with too few
    return ordered[keep].sort_index()


def sft_windows(settings: Settings, train: pd.DataFrame) -> list[list[str]]:
    """The sequence windows SFT trains on (``sft.objective: sequence``): the train split less
    each user's ``sft.holdout_recent`` newest rows, cut into windows of ``sft.window`` items
    every ``sft.window_stride`` items. GRPO's ``sft_anchor`` replays the same windows."""
    cfg = settings.sft
    kept = without_recent_rows(train, cfg.holdout_recent)
    return sequence_windows(kept, cfg.window, cfg.window_stride)


def recommender_options(settings: Settings) -> dict[str, Any]:
    """How every stage ranks: evaluate's beam width and batch size, the model's context and
    the split's history length."""
    return {
        "max_length": settings.model.max_length,
        "num_beams": settings.evaluate.num_beams,
        "max_history": settings.split.max_history,
        "batch_size": settings.evaluate.batch_size,
    }


def load_recommender(
    settings: Settings, folder: Path, sid_map: SidMap, item_ids: list[str], *, missing_hint: str
) -> SidRecommender:
    """A trained model folder behind the shared recommender, ranking as evaluate ranks (its
    beam width, batch size, context and history length); clear errors for a missing folder or
    a folder trained with another SID map."""
    try:
        return SidRecommender.from_dir(
            folder,
            missing_hint=missing_hint,
            sid_map=sid_map,
            item_ids=item_ids,
            **recommender_options(settings),
        )
    except ValueError as exc:
        raise InputError(
            f"the SID map does not match the model's tokenizer: {exc}", path=folder
        ) from None


def sid_token_matrix(tokenizer: Any, sid_map: SidMap, item_ids: list[str]) -> Any:
    """(items, L) tensor of the SID token ids of ``item_ids``, in that order (only for SIDs of
    one length, as the sequence windows assume)."""
    import torch

    return torch.tensor([tokenizer.convert_tokens_to_ids(sid_tokens(sid_map[i])) for i in item_ids])


def sasrec_loader(settings: Settings, item_ids: list[str]) -> Callable[[], SASRec]:
    """The ``baselines`` stage's SASRec, read from disk on the first call only: a stage that uses
    it twice (GRPO's collaborative reward and its anchor's teacher) shares one copy."""

    @cache
    def load() -> SASRec:
        from models.baselines.sasrec import load_baseline

        return load_baseline(settings.paths.sasrec_model, item_ids=item_ids)

    return load


def sasrec_teacher(
    settings: Settings,
    tokenizer: Any,
    sid_map: SidMap,
    item_ids: list[str],
    sasrec: Callable[[], SASRec] | None = None,
    *,
    ease_weight: float | None = None,
) -> Any:
    """The ``baselines`` stage's SASRec as the teacher ``sft.distill`` switches on (None: off),
    from ``sasrec`` (a :func:`sasrec_loader`) when the caller shares one; with
    ``sft.distill_ease`` > 0 (or ``ease_weight``, which replaces it), EASE fitted on the train
    split is blended into it."""
    cfg = settings.sft
    if cfg.distill == 0:
        return None
    from models.distill import SasrecTeacher

    model = (sasrec or sasrec_loader(settings, item_ids))()
    alpha = cfg.distill_ease if ease_weight is None else ease_weight
    ease = None
    if alpha > 0:
        from models.baselines.ease import EASE

        ease = EASE(
            item_ids=model.item_ids, l2=settings.grpo.ease_l2, recency=settings.grpo.ease_recency
        ).fit(read_split(settings, "train"))
    return SasrecTeacher(
        model,
        sid_token_matrix(tokenizer, sid_map, model.item_ids),
        bos_token_id=tokenizer.bos_token_id,
        weight=cfg.distill,
        temperature=cfg.distill_temperature,
        future=cfg.distill_future,
        horizon=cfg.distill_horizon,
        ease=ease,
        ease_weight=alpha,
    )


def check_teacher_ease(settings: Settings, n_items: int) -> None:
    """EASE in SFT's teacher (``sft.distill_ease``) or in GRPO's anchor (``grpo.anchor_ease``)
    must fit its dense inverse; the SFT stage asks before it trains, GRPO before it loads."""
    from models.baselines.ease import MAX_ITEMS

    if n_items <= MAX_ITEMS or settings.sft.distill == 0:  # no teacher: no EASE in it
        return
    grpo = settings.grpo
    used = [("sft.distill_ease", settings.sft.distill_ease)]
    if grpo.enabled and grpo.sft_anchor > 0 and grpo.anchor_ease is not None:
        used.append(("grpo.anchor_ease", grpo.anchor_ease))
    for key, weight in used:
        if weight > 0:
            raise ConfigError(
                f"{key} is {weight} but the catalog has {n_items} items: EASE inverts a dense "
                f"items × items matrix, up to {MAX_ITEMS} items; set {key}: 0"
            )
