"""A MiniOneRec data folder: ``*.item.json`` (catalog), ``*.index.json`` (SID map),
``info/*.txt`` (``SID<TAB>title<TAB>item_id``) and train/valid/test CSVs whose
``history_item_id`` column holds a Python-list string.

MiniOneRec's CSVs carry no timestamps. Interactions are rebuilt per user from the samples
(the first sample's history, then each sample's target) in file order train → valid → test,
which MiniOneRec writes chronologically; timestamps are synthesized as that global order,
one second apart from 2000-01-01 UTC, so they sort correctly but are not real times. That
order is checked, not trusted: a user's later sample must continue the earlier ones.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from sidrec.errors import InputError
from sidrec.sources.common import SourceTables, finish, normalize_ids, read_frame, require_columns

SPLIT_ORDER = ("train", "valid", "test")
SYNTHETIC_EPOCH = 946_684_800  # 2000-01-01T00:00:00Z


def category_of(path: Path) -> str | None:
    """The MiniOneRec category a file belongs to: the name before ``.item.json`` /
    ``.index.json``, or before ``_<k-core>_`` (``Industrial_and_Scientific_5_2016-10-2018-11.csv``);
    None for a name without one (``train.csv``)."""
    for suffix in (".item.json", ".index.json"):
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    match = re.match(r"(.+?)_\d+_", path.stem)
    return match.group(1) if match else None


def find_files(folder: Path, category: str | None = None) -> dict[str, list[Path]]:
    """The recognised files of a MiniOneRec folder, by kind: of ``category`` only, which must
    be given when the folder holds several (their item ids overlap: 0, 1, ... in each)."""
    if folder.is_file():
        raise InputError(
            "ingest.path names a file; the minionerec source reads a MiniOneRec data folder "
            "(*.item.json, *.index.json, train/valid/test CSVs): give the folder",
            path=folder,
        )
    if not folder.is_dir():
        raise InputError("MiniOneRec data folder does not exist", path=folder)
    found: dict[str, list[Path]] = {
        "item": [],
        "index": [],
        "info": [],
        **{s: [] for s in SPLIT_ORDER},
    }
    for path in sorted(folder.rglob("*")):
        name = path.name
        if name.endswith(".item.json"):
            found["item"].append(path)
        elif name.endswith(".index.json"):
            found["index"].append(path)
        elif path.suffix == ".txt" and path.parent.name == "info":
            found["info"].append(path)
        elif path.suffix == ".csv":
            split = _split_of(path)
            if split:
                found[split].append(path)
    found = _one_category(found, folder, category)
    if not any(found[s] for s in SPLIT_ORDER):
        raise InputError(
            "no train/valid/test CSV found (expected <folder>/{train,valid,test}/*.csv or files named *train*.csv ...)",
            path=folder,
        )
    if not found["item"] and not found["info"]:
        raise InputError("no item catalog found (expected *.item.json or info/*.txt)", path=folder)
    return found


def _one_category(
    found: dict[str, list[Path]], folder: Path, category: str | None
) -> dict[str, list[Path]]:
    present = sorted({c for files in found.values() for p in files if (c := category_of(p))})
    if category is None:
        if len(present) > 1:
            raise InputError(
                f"the folder holds {len(present)} MiniOneRec categories ({', '.join(present)}), "
                "whose item ids overlap; choose one with ingest.category (e.g. --set "
                f"ingest.category={present[0]})",
                path=folder,
            )
        return found
    if category not in present:
        raise InputError(
            f"ingest.category {category!r} has no files here (categories: "
            f"{', '.join(present) or 'none named'})",
            path=folder,
        )
    return {kind: [p for p in files if category_of(p) == category] for kind, files in found.items()}


def _split_of(path: Path) -> str | None:
    """The split a CSV belongs to: its folder name, else a whole word of its file name."""
    if path.parent.name in SPLIT_ORDER:
        return path.parent.name
    for split in SPLIT_ORDER:
        if re.search(rf"(^|[_\-.]){split}($|[_\-.])", path.stem.lower()):
            return split
    return None


def read_catalog(found: dict[str, list[Path]]) -> pd.DataFrame:
    if found["item"]:
        path = found["item"][0]
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"item file is not valid JSON ({exc})", path=path) from None
        if not isinstance(data, dict):
            raise InputError("item file must map item_id to an object with 'title'", path=path)
        rows = [{"item_id": str(k), **_text_fields(v)} for k, v in data.items()]
        return pd.DataFrame(rows)
    path = found["info"][0]
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"info file is not UTF-8 text (byte {exc.start})", path=path) from None
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise InputError(
                f"line {lineno} has {len(parts)} tab-separated fields, expected SID, title, item_id",
                path=path,
            )
        rows.append({"item_id": parts[2].strip(), "title": parts[1].strip()})
    return pd.DataFrame(rows)


def _text_fields(value: Any) -> dict[str, str]:
    value = value if isinstance(value, dict) else {}
    return {
        f: str(value.get(f) or "").strip() for f in ("title", "description", "brand", "categories")
    }


def read_samples(path: Path) -> pd.DataFrame:
    df = read_frame(path, "MiniOneRec split")
    require_columns(df, ("user_id", "history_item_id", "item_id"), path, "MiniOneRec split")
    histories = []
    for row, text in enumerate(df["history_item_id"].fillna("[]")):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise InputError(
                "history is not a Python list literal",
                path=path,
                column="history_item_id",
                rows=[row],
                values=[text],
            ) from None
        if not isinstance(value, list | tuple):
            raise InputError(
                "history is not a list",
                path=path,
                column="history_item_id",
                rows=[row],
                values=[text],
            )
        histories.append([str(v).strip() for v in value])
    targets = normalize_ids(df["item_id"])  # 114, not 114.0 where a blank made the column float
    return pd.DataFrame({"user_id": df["user_id"], "history": histories, "item_id": targets})


def rebuild_interactions(samples: list[tuple[Path, pd.DataFrame]]) -> pd.DataFrame:
    """Per user: the first sample's history and target, then every later sample's target.

    The files' order is taken as time order, so it is checked: a later sample's history must
    be the end of what the user's earlier samples rebuilt (MiniOneRec cuts each history to its
    newest items). A shuffled or re-sorted file breaks that and is refused, naming the file,
    rows and users, instead of rebuilding sequences in the wrong order."""
    sequences: dict[str, list[str | None]] = {}
    rows: list[tuple[str, str | None]] = []
    for path, frame in samples:
        bad: list[int] = []
        shown: list[str] = []
        for row, (user, history, target) in enumerate(frame.itertuples(index=False)):
            sequence = sequences.get(user)
            if sequence is None:
                sequence = sequences[user] = list(history)
                rows.extend((user, item) for item in history)
            elif not _continues(sequence, history):
                bad.append(row)
                shown.append(f"user {user}: {history[-3:]} after {sequence[-3:]}")
            item = None if pd.isna(target) else str(target)
            sequence.append(item)
            rows.append((user, item))
        if bad:
            raise InputError(
                f"{len(bad)} samples do not continue their user's earlier samples (the history "
                "is not the end of the items before it): the rows are not in time order, which "
                "the timestamp-free MiniOneRec files must be (as MiniOneRec writes them; was "
                "the file shuffled or sorted?)",
                path=path,
                column="history_item_id",
                rows=bad,
                values=shown,
            )
    users, items = zip(*rows, strict=True) if rows else ((), ())
    return pd.DataFrame(
        {
            "user_id": normalize_ids(pd.Series(users, dtype="string")),
            "item_id": normalize_ids(pd.Series(items, dtype="string")),
            "timestamp": pd.array(
                range(SYNTHETIC_EPOCH, SYNTHETIC_EPOCH + len(rows)), dtype="Int64"
            ),
        }
    )


def _continues(sequence: list[str | None], history: list[str]) -> bool:
    """Whether ``history`` is the end of ``sequence`` (a missing target, None, matches any item:
    validation reports it as a null item id, not as a broken order)."""
    if len(history) > len(sequence):
        return False
    tail = sequence[len(sequence) - len(history) :]
    return all(a is None or a == b for a, b in zip(tail, history, strict=True))


def read_minionerec(folder: Path, category: str | None = None) -> SourceTables:
    found = find_files(folder, category)
    catalog = read_catalog(found)
    catalog["item_id"] = normalize_ids(catalog["item_id"])
    split_files = [p for s in SPLIT_ORDER for p in found[s]]
    interactions = rebuild_interactions([(p, read_samples(p)) for p in split_files])
    files = {"interactions": split_files, "items": (found["item"] or found["info"])[:1]}
    notes = {f"{s}_files": len(found[s]) for s in SPLIT_ORDER}
    return finish(interactions, catalog, files, None, notes)
