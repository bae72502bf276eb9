"""EASE and the SASRec + EASE blend between the stage that chooses them (``baselines``) and the
one that reports them (``evaluate``).

``artifacts/baselines/<ds>/ease.json`` (:attr:`sidrec.paths.DatasetPaths.ease_choice`) holds
EASE's L2 and recency and the blend's α, chosen on the validation selection half, or the
reason both rows are left out (a catalog past EASE's limit). Evaluate refits EASE on the
train split with them (:func:`fitted_ease`): the closed form gives the weights the choice was
scored with, and the file stays a few bytes where the weights of a 10^4-item catalog are
hundreds of MB; :func:`ease_topks` ranks with EASE and the blend.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from models.baselines import ease as ease_module
from models.baselines import encode_histories
from models.baselines.blend import blend_scorer, ease_scorer, rank, sasrec_scorer
from models.baselines.ease import EASE
from models.baselines.sasrec import SASRec
from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.io import read_json

log = logging.getLogger(__name__)

EASE_ROWS = ("ease", "blend")
"""The evaluate rows the choice decides; both are left out together."""


class EaseChoice(NamedTuple):
    """What ``ease.json`` holds: the chosen values, or ``left_out`` (then the values are None)."""

    l2: float | None
    recency: float | None
    alpha: float | None
    left_out: str | None
    """Why the ease and blend rows are left out (None: they run)."""


def left_out_reason(n_items: int) -> str | None:
    """Why EASE cannot run on a catalog of ``n_items`` (None: it can): past
    :data:`models.baselines.ease.MAX_ITEMS` its dense inverse does not fit in memory."""
    limit = ease_module.MAX_ITEMS
    if n_items <= limit:
        return None
    return (
        f"the catalog has {n_items} items, above EASE's limit of {limit} (it inverts a dense "
        "items × items matrix), so the ease and blend rows are left out"
    )


def read_ease_choice(settings: Settings) -> EaseChoice:
    """``ease.json``, checked; a clear error where the baselines stage has not written it."""
    path = settings.paths.ease_choice
    record: Any = read_json(
        path,
        "the EASE choice",
        "run `sidrec baselines` (it chooses EASE's L2 and the blend's weight)",
    )
    if not isinstance(record, dict) or set(record) != set(EaseChoice._fields):
        raise InputError(
            f"the EASE choice holds {sorted(record) if isinstance(record, dict) else record!r}, "
            f"not the keys {list(EaseChoice._fields)}; re-run `sidrec baselines`",
            path=path,
        )
    choice = EaseChoice(**record)
    values = (choice.l2, choice.recency, choice.alpha)
    if choice.left_out is None and not all(isinstance(v, int | float) for v in values):
        raise InputError(
            f"the EASE choice names no L2, recency and α ({values}); re-run `sidrec baselines`",
            path=path,
        )
    return choice


def fitted_ease(
    choice: EaseChoice, item_ids: list[str], train: pd.DataFrame
) -> tuple[EASE | None, dict[str, str]]:
    """EASE refitted on the train split at the chosen L2 and recency, and the rows left out
    with their reason (EASE's and the blend's, where the catalog is past EASE's limit)."""
    reason = choice.left_out or left_out_reason(len(item_ids))
    if reason is not None:
        log.warning("the ease and blend rows are left out: %s", reason)
        return None, dict.fromkeys(EASE_ROWS, reason)
    assert choice.l2 is not None and choice.recency is not None  # read_ease_choice checks them
    return EASE(item_ids=item_ids, l2=choice.l2, recency=choice.recency).fit(train), {}


def ease_topks(
    sasrec: SASRec,
    ease: EASE,
    alpha: float,
    histories: list[list[str]],
    exclude: list[list[str]] | None,
    index: dict[str, int],
    k: int,
) -> dict[str, np.ndarray]:
    """EASE's and the blend's top-k of each row (scored batch by batch)."""
    encoded = encode_histories(histories, index, "histories")
    banned = None if exclude is None else encode_histories(exclude, index, "exclusions")
    both = blend_scorer(sasrec_scorer(sasrec), ease_scorer(ease), alpha)
    return {
        "ease": rank(ease_scorer(ease), encoded, k, exclude=banned),
        "blend": rank(both, encoded, k, exclude=banned),
    }
