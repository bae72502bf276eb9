"""Amazon Beauty 5-core as P5 and TIGER prepared it: two CSV files in a folder
(``ingest.amazon_beauty_dir``), read as the ``csv`` source reads them once their hashes match.

The files keep each user's items in the source's order, stamped one day apart (the source has
no times), so the leave-one-out split holds out the published protocol's last two items."""

from __future__ import annotations

from pathlib import Path

from sidrec.errors import InputError
from sidrec.sources.common import SourceTables, verify_sha256
from sidrec.sources.tabular import read_tabular

SHA256 = {
    "interactions.csv": "621121e9008669424a7276635a8aae49df812be0c689a43019bebc9db82d5bdf",
    "items.csv": "ec77a873316bf1d9fe36452c5466a82e54f9704bacf4adde782ac8991684c5e7",
}
"""The folder's files (its ``SHA256SUMS``): 22,363 users, 12,101 items, 198,502 interactions."""


def amazon_beauty_files(folder: Path) -> list[Path]:
    """The interactions and items files in ``folder``, which must exist."""
    if not folder.is_dir():
        raise InputError(
            "source amazon-beauty: no such folder (the P5/TIGER Beauty 5-core, "
            "interactions.csv + items.csv); set ingest.amazon_beauty_dir to the folder that "
            "holds them, or read such files as any CSV: --source csv --interactions FILE "
            "--items FILE --set project.profile=amazon-beauty",
            path=folder,
        )
    return [folder / name for name in SHA256]


def read_amazon_beauty(folder: Path, min_rating: float | None = None) -> SourceTables:
    """The folder's tables, refused unless its files are the published ones."""
    files = amazon_beauty_files(folder)
    verify_sha256(
        dict(zip(files, SHA256.values(), strict=True)),
        origin="the P5/TIGER Amazon Beauty 5-core set",
        fix=(
            "restore the folder's files, or read changed files as any CSV: --source csv "
            "--interactions FILE --items FILE --set project.profile=amazon-beauty"
        ),
    )
    return read_tabular(files[0], files[1], min_rating=min_rating)
