"""Helpers shared by the source readers: robust file reading, id and timestamp normalization."""

from __future__ import annotations

import csv
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sidrec.errors import InputError
from sidrec.io import file_sha256

log = logging.getLogger(__name__)

ITEM_TEXT_FIELDS = ("title", "description", "brand", "categories")
MS_THRESHOLD = 1e11
"""Numeric timestamps above this are milliseconds (1e11 s is the year 5138)."""
MAX_SECONDS = pd.Timestamp.max.value // 10**9
"""Unix seconds of this size or more (or infinite) are no date: beyond pandas' Timestamp range
(the years 1677 to 2262), they would overflow int64 or any date arithmetic downstream."""


@dataclass
class SourceTables:
    """What a source reader returns: normalized tables plus provenance."""

    interactions: pd.DataFrame
    """user_id (str), item_id (str), timestamp (Int64 Unix seconds)[, rating (float)]."""
    items: pd.DataFrame
    """item_id (str), title (str), further text fields (str)."""
    files: dict[str, list[Path]]
    """The files each table came from ("interactions", "items"), for provenance and messages."""
    notes: dict[str, int] = field(default_factory=dict)
    """Counts of rows dropped or repaired on the way (reported, never silent)."""


def verify_sha256(expected: Mapping[Path, str], origin: str, fix: str) -> None:
    """Refuse a built-in source whose files are missing or differ from the ones its published
    numbers were measured on: an InputError naming the file, the expected SHA-256, ``origin``
    (where the file should come from) and ``fix``."""
    for path, sha256 in expected.items():
        if not path.is_file():
            raise InputError(
                f"missing; expected the file of {origin} (sha256 {sha256}); {fix}", path=path
            )
        found = file_sha256(path)
        if found != sha256:
            raise InputError(
                f"sha256 is {found}, expected {sha256}: not the file of {origin}; {fix}",
                path=path,
            )


def read_frame(path: Path, what: str) -> pd.DataFrame:
    """Read CSV/TSV (every column as text) or Parquet, turning any failure into an InputError."""
    if not path.exists():
        raise InputError(f"{what} file does not exist", path=path)
    if path.is_dir():
        raise InputError(f"{what} path is a directory, expected a file", path=path)
    if path.stat().st_size == 0:
        raise InputError(f"{what} file is empty (0 bytes)", path=path)
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            require_unique_columns(pq.read_schema(path).names, path, what)
            return pq.read_table(path).to_pandas()
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{what} file is not readable Parquet ({exc})", path=path) from None
    head = path.open("rb").read(8192)
    if b"\x00" in head:
        raise InputError(
            f"{what} file looks binary (NUL bytes), expected CSV text or Parquet", path=path
        )
    try:
        text_head = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a multi-byte character cut at the 8 KiB boundary
            raise InputError(
                f"{what} file is not UTF-8 text (byte {exc.start})", path=path
            ) from None
        text_head = head[: exc.start].decode("utf-8")
    sep = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        # only blank fields are missing: a title "None" or an id "NA" is text like any other
        df = pd.read_csv(
            path, sep=sep, dtype=str, keep_default_na=False, na_values=[""], encoding="utf-8"
        )
    except pd.errors.EmptyDataError:
        raise InputError(f"{what} file has no header line", path=path) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{what} file is not valid CSV ({str(exc).strip()})", path=path) from None
    # rows longer than the header: pandas takes the surplus leading field(s) as an index
    if not isinstance(df.index, pd.RangeIndex):
        raise InputError(
            f"{what} file has rows with more fields than its header's {len(df.columns)} "
            f"(first at line {_first_long_line(path, sep, len(df.columns))}): a trailing {sep!r} "
            f"or an unquoted {sep!r} inside a value; fix those rows or quote the value",
            path=path,
        )
    # pandas renames a repeated header name ("timestamp.1"), so check the header as written;
    # blank names are no duplicates (pandas names them "Unnamed: n")
    header = pd.read_csv(path, sep=sep, header=None, nrows=1, dtype=str, keep_default_na=False)
    names = [str(c).strip() for c in header.iloc[0]]
    require_unique_columns([c for c in names if c], path, what)
    df.columns = [str(c).strip() for c in df.columns]
    blank = [col for col, name in zip(df.columns, names, strict=True) if not name]
    if blank:  # a saved pandas index, say: no name, so no field of ours
        log.warning("%s: dropping %d column(s) with no header name", path, len(blank))
        df = df.drop(columns=blank)
    df.attrs["blank_header_columns_dropped"] = len(blank)
    df.attrs["delimiter_hint"] = _delimiter_hint(text_head, sep, list(df.columns))
    return df


def _first_long_line(path: Path, sep: str, fields: int) -> int:
    """The 1-based line of the first record with more than ``fields`` fields."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter=sep)
        for record in reader:
            if len(record) > fields:
                return reader.line_num
    return 0


def _delimiter_hint(text_head: str, sep: str, columns: list[str]) -> str:
    if len(columns) > 1:
        return ""
    try:
        found = (
            csv.Sniffer()
            .sniff(text_head.splitlines()[0] if text_head else "", delimiters=";\t|,")
            .delimiter
        )
    except csv.Error:
        return ""
    return (
        f" The header is a single column; the file seems delimited by {found!r}, expected {sep!r}."
        if found != sep
        else ""
    )


def require_unique_columns(columns: list[str], path: Path, what: str) -> None:
    repeated = [c for c, n in Counter(columns).items() if n > 1]
    if repeated:
        raise InputError(
            f"{what} file has duplicate column name(s) {repeated}; which one to read is "
            "ambiguous, rename or remove the extra column(s)",
            path=path,
            column=repeated[0],
        )


def require_columns(df: pd.DataFrame, columns: tuple[str, ...], path: Path, what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        hint = df.attrs.get("delimiter_hint", "")
        raise InputError(
            f"{what} file lacks required column(s) {missing}; found {list(df.columns)}.{hint}",
            path=path,
            column=missing[0],
        )


def normalize_ids(values: pd.Series) -> pd.Series:
    """Ids as trimmed strings; blanks become missing (so validation reports them as null)."""
    out = values.astype("string").str.strip()
    out = out.mask(out == "")
    # numeric ids read from Parquet as floats (1.0) become "1"
    if pd.api.types.is_float_dtype(values.dtype):
        as_int = pd.to_numeric(values, errors="coerce")
        whole = as_int.notna() & (as_int == np.floor(as_int))
        out = out.where(~whole, as_int.astype("Int64").astype("string"))
    return out


DAY_MONTH_DATE = r"^\d{1,2}[/.\-]\d{1,2}[/.\-]\d{2,4}(?!\d)"
"""03/04/2020, 3.4.20, 13-04-2020: a date whose day and month order the text does not say."""


def parse_timestamps(values: pd.Series, path: Path, column: str, sample: int = 5) -> pd.Series:
    """Unix seconds (Int64) from numbers (seconds or milliseconds) or date-time strings.
    Missing values stay missing; values that cannot be parsed raise an InputError."""
    text = values.astype("string").str.strip()
    present = text.notna() & (text != "")
    numeric = pd.to_numeric(text.where(present), errors="coerce").astype("float64")
    seconds = within_dates(numeric.where(numeric.abs() < MS_THRESHOLD, numeric / 1000.0))
    needs_parse = present & numeric.isna()
    ambiguous = needs_parse & text.str.match(DAY_MONTH_DATE).fillna(False).astype(bool)
    # pandas would read 03/04 month-first, 13/04 day-first, row by row
    problem = (
        "timestamp(s) are dates with the day and the month both in numbers before the year "
        "(day-first or month-first cannot be told apart); write ISO 8601 (2020-04-03) or Unix "
        "seconds"
    )
    refuse_rows(text, ambiguous, path, column, problem, sample)
    if needs_parse.any():
        parsed = pd.to_datetime(text.where(needs_parse), errors="coerce", utc=True, format="mixed")
        epoch = pd.Timestamp("1970-01-01", tz="UTC")
        parsed_s = (parsed - epoch) / pd.Timedelta(seconds=1)
        seconds = seconds.where(~needs_parse, parsed_s)
    problem = (
        "timestamp(s) cannot be parsed (expected Unix seconds/milliseconds or ISO 8601, between "
        "the years 1677 and 2262)"
    )
    refuse_rows(text, present & seconds.isna(), path, column, problem, sample)
    return np.floor(seconds.astype("float64")).astype("Int64")


def within_dates(seconds: pd.Series) -> pd.Series:
    """``seconds`` with the values that cannot be a date (infinite, too large) made missing."""
    return seconds.where(seconds.abs() < MAX_SECONDS)


def parse_ratings(values: pd.Series, path: Path, column: str, sample: int = 5) -> pd.Series:
    """Ratings as floats; missing values stay missing. Anything else that is not a finite number
    ("five", "inf", "nan" as text, a list) raises an InputError rather than becoming a missing
    rating, which ``ingest.min_rating`` would silently count as too low."""
    rating = pd.to_numeric(values, errors="coerce").astype("float64")
    bad = values.notna() & ~np.isfinite(rating)
    problem = "rating(s) are not numbers (expected finite values such as 4 or 4.5)"
    refuse_rows(values, bad, path, column, problem, sample)
    return rating


def refuse_rows(
    values: pd.Series,
    bad: pd.Series,
    path: Path,
    column: str,
    problem: str,
    sample: int = 5,
    shown: Callable[[Any], Any] = lambda v: v,
) -> None:
    """An InputError naming the file, the column, how many rows ``bad`` marks (``problem``
    says what is wrong with them), the first ``sample`` of them and their values (as ``shown``
    renders each); nothing when no row is bad."""
    if bad.any():
        raise InputError(
            f"{int(bad.sum())} {problem}",
            path=path,
            column=column,
            rows=np.flatnonzero(bad.to_numpy())[:sample].tolist(),
            values=[shown(v) for v in values[bad].head(sample)],
        )


def finish(
    interactions: pd.DataFrame,
    items: pd.DataFrame,
    files: dict[str, list[Path]],
    min_rating: float | None,
    notes: dict[str, int],
) -> SourceTables:
    """Common tail of every reader: column order, rating filter, exact duplicate catalog rows."""
    if min_rating is not None:
        if "rating" not in interactions.columns:
            raise InputError(
                f"ingest.min_rating is {min_rating} but the source has no rating column",
                path=files["interactions"][0],
            )
        keep = interactions["rating"] >= min_rating
        notes["interactions_below_min_rating"] = int((~keep).sum())
        interactions = interactions[keep]
    cols = ["user_id", "item_id", "timestamp"] + (
        ["rating"] if "rating" in interactions.columns else []
    )
    interactions = interactions[cols].reset_index(drop=True)
    item_cols = ["item_id", "title"] + [c for c in items.columns if c not in ("item_id", "title")]
    items = items[item_cols]
    before = len(items)
    items = items.drop_duplicates().reset_index(drop=True)
    notes["duplicate_item_rows_dropped"] = before - len(items)
    for col in item_cols[1:]:
        items[col] = items[col].astype("string")
    return SourceTables(interactions=interactions, items=items, files=files, notes=notes)
