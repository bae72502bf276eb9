"""Semantic IDs: the token format, the SID map file, MiniOneRec ``.index.json`` import/export.

A SID is a list of integer codes, one per level. Its token form is one token per level,
``<a_12><b_3><c_7>``: the letter names the level, so each level has its own vocabulary range.
:func:`sid_tokens` is the one place that rendering is defined.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from sidrec.errors import InputError
from sidrec.io import read_json

LEVEL_LETTERS = string.ascii_lowercase
TOKEN_RE = re.compile(r"<([a-z])_(\d+)>")

SidMap = dict[str, list[int]]
"""item_id → codes (all the same length, all distinct)."""


def level_token(level: int, code: int) -> str:
    return f"<{LEVEL_LETTERS[level]}_{code}>"


def sid_tokens(codes: Sequence[int]) -> list[str]:
    """``[12, 3, 7]`` → ``["<a_12>", "<b_3>", "<c_7>"]``."""
    return [level_token(level, int(code)) for level, code in enumerate(codes)]


def sid_string(codes: Sequence[int]) -> str:
    """``[12, 3, 7]`` → ``"<a_12><b_3><c_7>"``."""
    return "".join(sid_tokens(codes))


def parse_sid(text: str | Sequence[str]) -> list[int]:
    """``"<a_12><b_3><c_7>"`` or its token list → ``[12, 3, 7]``; levels must run a, b, c, ..."""
    joined = text if isinstance(text, str) else "".join(text)
    matches = TOKEN_RE.findall(joined)
    if not matches or TOKEN_RE.sub("", joined).strip():
        raise ValueError(f"not a SID token sequence: {joined!r}")
    letters = "".join(letter for letter, _ in matches)
    if letters != LEVEL_LETTERS[: len(matches)]:
        raise ValueError(
            f"SID levels must run {LEVEL_LETTERS[: len(matches)]!r}, got {letters!r} in {joined!r}"
        )
    return [int(code) for _, code in matches]


class CollisionStats(NamedTuple):
    items: int
    distinct: int
    collision_rate: float
    """(items − distinct SIDs) / items."""
    largest_group: int
    """Size of the biggest set of items sharing one SID (1 when collision-free)."""


def collision_stats(codes: np.ndarray) -> CollisionStats:
    """Collision statistics of an (items × levels) code matrix."""
    n = len(codes)
    if n == 0:
        return CollisionStats(0, 0, 0.0, 0)
    counts = np.unique(np.asarray(codes), axis=0, return_counts=True)[1]
    return CollisionStats(n, len(counts), (n - len(counts)) / n, int(counts.max()))


def check_sid_map(sid_map: Mapping[str, Sequence[int]], where: str | Path) -> None:
    """Every SID the same length, non-negative, and unique; raises InputError naming offenders."""
    if not sid_map:
        raise InputError("SID map is empty", path=where)
    lengths = Counter(len(v) for v in sid_map.values())
    if len(lengths) > 1:
        raise InputError(
            f"SIDs have different lengths {dict(lengths)}; all must be equal", path=where
        )
    bad = [k for k, v in sid_map.items() if any((not isinstance(c, int)) or c < 0 for c in v)]
    if bad:
        raise InputError("SID codes must be non-negative integers", path=where, values=bad[:5])
    groups: dict[tuple[int, ...], list[str]] = {}
    for item, codes in sid_map.items():
        groups.setdefault(tuple(codes), []).append(item)
    clashes = {sid: items for sid, items in groups.items() if len(items) > 1}
    if clashes:
        sid, worst = max(clashes.items(), key=lambda kv: len(kv[1]))
        raise InputError(
            f"{sum(len(c) for c in clashes.values())} items share a SID with another item "
            f"({len(clashes)} groups; largest: items {worst[:5]} share {sid_string(sid)})",
            path=where,
        )


def read_sid_map(path: Path) -> SidMap:
    """Load and check ``sid_map.json``."""
    data = read_json(path, "SID map", "run `sidrec sids` first")
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise InputError(
            "SID map must be a JSON object of item_id → list of integer codes", path=path
        )
    sid_map = {str(k): v for k, v in data.items()}
    check_sid_map(sid_map, path)
    return sid_map


def read_retired_sids(path: Path) -> SidMap:
    """Load ``retired.json`` (item_id → the SID it had); {} where there is none."""
    if not path.exists():
        return {}
    data = read_json(path, "retired SIDs", "run `sidrec sids` with sids.incremental=false")
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise InputError(
            "retired SIDs must be a JSON object of item_id → list of integer codes", path=path
        )
    retired = {str(k): v for k, v in data.items()}
    if retired:
        check_sid_map(retired, path)
    return retired


def read_minionerec_index(path: Path) -> SidMap:
    """A MiniOneRec ``.index.json`` (``{"0": ["<a_236>", "<b_231>", "<c_226>"]}``) as a SID map.
    Collisions are NOT checked here (see :func:`check_sid_map`)."""
    if not path.exists():
        raise InputError("MiniOneRec index file does not exist", path=path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"index file is not valid JSON ({exc})", path=path) from None
    if not isinstance(data, dict) or not data:
        raise InputError(
            "index file must be a non-empty JSON object of item_id → SID tokens", path=path
        )
    out: SidMap = {}
    for item, tokens in data.items():
        try:
            if not isinstance(tokens, list | str):
                raise ValueError(f"expected a list of tokens, got {type(tokens).__name__}")
            out[str(item)] = parse_sid(tokens)
        except ValueError as exc:
            raise InputError(f"item {item!r}: {exc}", path=path) from None
    lengths = Counter(len(v) for v in out.values())
    if len(lengths) > 1:
        raise InputError(f"SIDs have different lengths {dict(lengths)}", path=path)
    return out


def to_minionerec_index(sid_map: Mapping[str, Sequence[int]]) -> dict[str, list[str]]:
    return {item: sid_tokens(codes) for item, codes in sid_map.items()}
