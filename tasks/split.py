"""Stage 3 — split: ``data/processed/<ds>/{train,valid,test}.parquet``, one row per
(user, history, target).

Order within a user: by timestamp, ties kept in the order the rows come from the source
(ingest and validate keep the source's row order) — a stable sort on (user, timestamp), never
by item id. This is what RecBole does before its leave-one-out split, so on MovieLens-100k
our valid and test targets are RecBole's (many of its users rate several movies in their last
second, where an id tie-break would pick another target). A shuffled file gives the same split
wherever a user's timestamps are distinct; same-second ties follow the file.

``sliding_window`` orders all samples by target time, ties again in source row order.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from prefect import task

from sidrec.config import Settings, SplitConfig
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs, read_table
from sidrec.orchestration import StageCache, publish_table
from sidrec.paths import SPLITS
from sidrec.protocol import user_sequences
from sidrec.schemas import HISTORY, INTERACTIONS, SPLIT
from sidrec.stage import StageResult

log = logging.getLogger(__name__)


def samples(seq: pd.DataFrame, max_history: int) -> pd.DataFrame:
    """Every (user, target) with a non-empty history: targets at positions >= 1. The history
    is ``seq``'s rows ``first`` … ``end - 1`` (oldest first, at most ``max_history``), built
    once a part's rows are chosen (:func:`parts_with_histories`)."""
    pos = seq["pos"].to_numpy()
    rows = np.flatnonzero(pos >= 1)
    first = rows - np.minimum(pos[rows], max_history)  # each target's oldest history row

    def column(name: str) -> np.ndarray:
        return seq[name].to_numpy()[rows]

    return pd.DataFrame(
        {
            "user_id": seq["user_id"].array.take(rows),
            "target": seq["item_id"].array.take(rows),
            "timestamp": column("timestamp").astype("int64"),
            "pos": column("pos"),
            "length": column("length"),
            "row": column("row"),
            "first": first,
            "end": rows,
        }
    )


def parts_with_histories(
    parts: dict[str, pd.DataFrame], items: pd.Series
) -> dict[str, pd.DataFrame]:
    """Each part's rows with their ``history`` (from ``items``, the item id of each row of the
    user sequences), in ``SPLIT``'s columns. Histories are built last, per part: filtering or
    sorting a built list column copies it through 64-bit child indices (MovieLens-1M × 200:
    leave-one-out peaked at 2.9 GB against 1.5 GB, the sliding window's sort past 14 GB)."""
    codes, ids = pd.factorize(items)
    dictionary = pa.array(ids, type=pa.string())
    out = {}
    for name, df in parts.items():
        rows = df.reset_index(drop=True)
        history = history_lists(codes, dictionary, rows["first"].to_numpy(), rows["end"].to_numpy())
        out[name] = rows.assign(history=history)[list(SPLIT.names)]
    return out


def history_lists(
    codes: np.ndarray, dictionary: pa.Array, first: np.ndarray, end: np.ndarray
) -> pd.Series:
    """``codes[first[r]:end[r]]`` for every r, as one Arrow column of the split's history type
    (item-id codes into ``dictionary``, four bytes per history entry; see
    ``sidrec.schemas.HISTORY``), filled one history position at a time: a Python list per
    sample was most of the stage's time at 10^6 interactions (bench/scale.py)."""
    lengths = end - first
    offsets = np.zeros(len(end) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(offsets[-1], dtype=np.int32)
    for k in range(int(lengths.max(initial=0))):
        has = np.flatnonzero(lengths > k)
        values[offsets[has] + k] = codes[first[has] + k]
    entries = pa.DictionaryArray.from_arrays(values, dictionary)
    lists = pa.LargeListArray.from_arrays(offsets, entries, type=HISTORY)
    return pd.Series(lists, dtype=pd.ArrowDtype(lists.type))


def leave_one_out(inter: pd.DataFrame, cfg: SplitConfig) -> dict[str, pd.DataFrame]:
    """Per user: last item → test, second-to-last → valid, earlier targets → train."""
    seq = user_sequences(inter)
    s = samples(seq, cfg.max_history)
    from_end = s["length"] - 1 - s["pos"]
    parts = {"train": s[from_end >= 2], "valid": s[from_end == 1], "test": s[from_end == 0]}
    return parts_with_histories(parts, seq["item_id"])


def sliding_window(inter: pd.DataFrame, cfg: SplitConfig) -> dict[str, pd.DataFrame]:
    """MiniOneRec: all samples in target-time order (ties: the target's source row), cut 8:1:1."""
    seq = user_sequences(inter)
    s = samples(seq, cfg.max_history)
    s = s.sort_values(["timestamp", "row"]).reset_index(drop=True)
    n = len(s)
    a = round(n * cfg.ratios[0])
    b = round(n * (cfg.ratios[0] + cfg.ratios[1]))
    parts = {"train": s.iloc[:a], "valid": s.iloc[a:b], "test": s.iloc[b:]}
    return parts_with_histories(parts, seq["item_id"])


def check_parts(parts: dict[str, pd.DataFrame], cfg: SplitConfig, source: Path) -> None:
    """Every part holds samples: an empty valid or test part would be written, and every
    later stage would select or report on nothing."""
    empty = [name for name in SPLITS if parts[name].empty]
    if not empty:
        return
    sizes = ", ".join(f"{name} {len(parts[name])}" for name in SPLITS)
    if cfg.method == "sliding_window":
        fix = f"split.ratios {list(cfg.ratios)} leave it no sample: give it a larger share"
    else:
        fix = (
            "leave_one_out needs users with at least 3 interactions for a train sample "
            "(validate.min_user_interactions drops shorter users)"
        )
    raise InputError(
        f"the split's {' and '.join(empty)} part is empty ({sizes}): {fix}", path=source
    )


def split(settings: Settings) -> StageResult:
    paths = settings.paths
    inter = read_table(paths.validated("interactions"), INTERACTIONS, "validated interactions")
    method = leave_one_out if settings.split.method == "leave_one_out" else sliding_window
    parts = method(inter, settings.split)
    check_parts(parts, settings.split, paths.validated("interactions"))
    metrics: dict[str, Any] = {"dataset": settings.project.dataset, "method": settings.split.method}
    for name, df in parts.items():
        metrics[name] = {
            "rows": len(df),
            "users": int(df["user_id"].nunique()),
            "mean_history": round(float(df["history"].list.len().mean()), 3) if len(df) else 0.0,
        }
    outputs = [paths.split(name) for name in SPLITS] + [paths.metrics("split")]
    with AtomicOutputs() as out:
        for name in SPLITS:
            out.parquet(parts[name], paths.split(name), SPLIT)
        out.json(metrics, outputs[-1])
    log.info("split %s: %s", settings.split.method, {n: metrics[n]["rows"] for n in SPLITS})
    summary = " · ".join(f"{s} {metrics[s]['rows']:,}" for s in SPLITS)
    return StageResult.from_files("split", outputs, metrics, summary)


@task(name="split", cache_policy=StageCache(stage="split"), persist_result=True)
def split_task(settings: Settings) -> StageResult:
    result = split(settings)
    m = result.metrics
    publish_table(
        "split-stats",
        m["dataset"],
        [{"split": n, **m[n]} for n in SPLITS],
        description=f"{m['method']} split of {m['dataset']}",
    )
    return result
