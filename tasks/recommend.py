"""Recommendations from the registered champion (``models:/<name>@champion``).

Used by ``sidrec recommend`` (one user, or an explicit history) and the ``batch-recommend``
flow (every user, to ``data/processed/<ds>/recommendations.parquet``). A user's history is
their whole known sequence in ``data/validated/<ds>/interactions.parquet`` (ordered like the
splits); the served model prompts with its most recent ``split.max_history`` items and
excludes all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pyarrow as pa
from mlflow.exceptions import MlflowException
from prefect import task

from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.io import AtomicOutputs, read_table
from sidrec.orchestration import publish_stats
from sidrec.progress import ProgressBar
from sidrec.protocol import user_sequences
from sidrec.registry import Champion, load_champion
from sidrec.schemas import INTERACTIONS

log = logging.getLogger(__name__)

RECOMMENDATIONS = pa.schema(
    [
        pa.field("user_id", pa.string()),
        pa.field("rank", pa.int32()),  # 1 = best
        pa.field("item_id", pa.string()),
        pa.field("title", pa.string()),
        pa.field("score", pa.float64()),  # beam score: log-probability per generated token
    ]
)
"""``recommendations.parquet``: top-K per user, one row per (user, rank)."""


def recommendations_path(settings: Settings) -> Path:
    return settings.paths.processed_dir / "recommendations.parquet"


def user_histories(settings: Settings) -> pd.DataFrame:
    """(user_id, history) for every user: their whole known sequence, oldest first. The served
    model prompts with the most recent ``split.max_history`` items and, like evaluate, never
    recommends an item of the history it is given."""
    inter = read_table(
        settings.paths.validated("interactions"), INTERACTIONS, "validated interactions"
    )
    grouped = user_sequences(inter).groupby("user_id", sort=True)["item_id"].agg(list)
    return pd.DataFrame({"user_id": grouped.index.astype(str), "history": grouped.to_list()})


def user_history(settings: Settings, user_id: str) -> list[str]:
    histories = user_histories(settings)
    match = histories.loc[histories["user_id"] == user_id, "history"]
    if match.empty:
        sample = histories["user_id"].head(5).tolist()
        raise InputError(
            f"unknown user {user_id!r} ({len(histories):,} users, e.g. {sample}); "
            "pass --history ID,ID,... for a user without interactions",
            path=settings.paths.validated("interactions"),
        )
    return list(match.iloc[0])


def predict(champion: Champion, histories: Sequence[Sequence[str]], k: int) -> pd.DataFrame:
    """The champion's ``item_ids``/``titles``/``scores`` per history (and, for models registered
    since serving drops unknown items, ``unknown_items`` and ``fallback``); a request the
    model refuses → InputError with its message."""
    frame = pd.DataFrame({"history": [list(h) for h in histories]})
    try:
        return champion.model.predict(frame, params={"k": k})
    except (ValueError, MlflowException) as exc:  # the model's message names what it refused
        message = exc.message if isinstance(exc, MlflowException) else str(exc)
        raise InputError(f"{champion.uri}: {message}") from None


class Recommended(NamedTuple):
    table: pd.DataFrame
    """rank, item_id, title, score"""
    unknown_items: list[str]
    """History items the champion does not know (dropped from the history it read)."""
    fallback: bool
    """True when no history item was known: the most popular items."""


def recommend(
    settings: Settings,
    *,
    user: str | None = None,
    history: Sequence[str] | None = None,
    k: int = 10,
    champion: Champion | None = None,
) -> Recommended:
    """Top-``k`` for one user (their known history) or an explicit ``history``."""
    if (user is None) == (history is None):
        raise InputError("pass either a user id or a history of item ids, not both or neither")
    items = user_history(settings, user) if user is not None else list(history or [])
    champion = champion or load_champion(settings)
    row = predict(champion, [items], k).iloc[0]
    table = pd.DataFrame(
        {
            "rank": range(1, len(row["item_ids"]) + 1),
            "item_id": list(row["item_ids"]),
            "title": list(row["titles"]),
            "score": list(row["scores"]),
        }
    )
    unknown = [str(i) for i in row.get("unknown_items", [])]
    return Recommended(table, unknown, bool(row.get("fallback", False)))


def recommend_all(
    settings: Settings, *, k: int, batch_size: int = 64, champion: Champion | None = None
) -> pd.DataFrame:
    """Top-``k`` for every user, as :data:`RECOMMENDATIONS` rows, ``batch_size`` users per call."""
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    histories = user_histories(settings)
    champion = champion or load_champion(settings)
    frames = []
    dropped = fallback = short = 0
    for start in ProgressBar(range(0, len(histories), batch_size), desc="recommend", unit="batch"):
        chunk = histories.iloc[start : start + batch_size]
        out = predict(champion, list(chunk["history"]), k)
        if "fallback" in out.columns:  # models registered since serving drops unknown items
            dropped += int(out["unknown_items"].map(len).sum())
            fallback += int(out["fallback"].sum())
        short += int((out["item_ids"].map(len) < k).sum())
        rows = pd.DataFrame(
            {
                "user_id": chunk["user_id"].to_numpy(),
                "item_id": out["item_ids"].to_numpy(),
                "title": out["titles"].to_numpy(),
                "score": out["scores"].to_numpy(),
            }
        ).explode(["item_id", "title", "score"], ignore_index=True)
        frames.append(rows[rows["item_id"].notna()])  # explode leaves an empty list one null row
    if dropped or fallback:
        log.warning(
            "%d history item(s) unknown to %s were dropped; %d user(s) with no known item got "
            "the most popular items",
            dropped,
            champion.uri,
            fallback,
        )
    if short:
        log.warning(
            "%d user(s) got fewer than %d items: fewer unseen catalog items were left", short, k
        )
    table = pd.concat(frames, ignore_index=True) if frames else _empty()
    table["rank"] = table.groupby("user_id", sort=False).cumcount() + 1
    return table[RECOMMENDATIONS.names].astype({"score": "float64", "rank": "int32"})


def _empty() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=object) for name in RECOMMENDATIONS.names})


def write_recommendations(settings: Settings, table: pd.DataFrame) -> Path:
    path = recommendations_path(settings)
    with AtomicOutputs() as out:
        out.parquet(table, path, RECOMMENDATIONS)
    return path


@task(name="batch-recommend")
def batch_recommend_task(settings: Settings, k: int, batch_size: int = 64) -> str:
    """Top-``k`` for every user from the champion, written to ``recommendations.parquet``.
    Not cached: the champion can change between runs without any input file changing."""
    champion = load_champion(settings)
    table = recommend_all(settings, k=k, batch_size=batch_size, champion=champion)
    path = write_recommendations(settings, table)
    publish_stats(
        "recommendations",
        settings.project.dataset,
        {
            "model": f"{champion.uri} (version {champion.version})",
            "users": int(table["user_id"].nunique()),
            "rows": len(table),
            "k": k,
            "file": str(path),
        },
        description="Batch recommendations from the champion",
    )
    log.info("wrote %d recommendations to %s", len(table), path)
    return str(path)
