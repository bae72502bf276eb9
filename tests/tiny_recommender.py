"""A tiny recommender project on disk, in seconds: catalog, interactions, SID map, a randomly
initialized tiny model folder and ``metrics/eval.json`` — what the register stage, the pyfunc
model and ``sidrec recommend`` read. (Random weights: tests assert structure, not quality.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sidrec.config import Settings, load_settings
from sidrec.io import AtomicOutputs, atomic_write_json
from sidrec.schemas import INTERACTIONS, ITEMS

N_ITEMS, LEVELS, CODES = 12, 2, 4
ITEM_IDS = [f"i{n}" for n in range(N_ITEMS)]
TITLES = {
    i: f"Film number {n} about {['space', 'love', 'war'][n % 3]}" for n, i in enumerate(ITEM_IDS)
}
SID_MAP = {i: [n // CODES, n % CODES] for n, i in enumerate(ITEM_IDS)}
USERS = {
    "u1": ["i0", "i1", "i2", "i3"],
    "u2": ["i5", "i4"],
    "u3": ["i7", "i8", "i9", "i10", "i11"],
    "u4": ["i2", "i3", "i4", "i5"],
    "u5": ["i6", "i7", "i8"],
    "u6": ["i0", "i2", "i4", "i6"],
    "u7": ["i1", "i3", "i5", "i7", "i9"],
    "u8": ["i11", "i10", "i9", "i8"],
}
"""Interactions in time order; u1, u4, u5, u7 and u8 are in the validation gate half."""


def tiny_overrides(**sections: dict[str, Any]) -> list[str]:
    """``--set`` overrides of the tiny project (``sections`` replace or add keys)."""
    base: dict[str, dict[str, Any]] = {
        "project": {"dataset": "tiny"},
        "model": {"max_length": 64},
        "split": {"max_history": 3},
        "grpo": {"enabled": False},
        "evaluate": {"ks": [1, 5, 10], "num_beams": 10, "bootstrap_resamples": 200},
        "sasrec": {"max_epochs": 2},
        "register": {"top_k": 5},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return [
        f"{section}.{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"
        for section, values in base.items()
        for key, value in values.items()
    ]


def tiny_settings(project: Path, **sections: dict[str, Any]) -> Settings:
    return load_settings(project / "params.yaml", tiny_overrides(**sections))


def catalog() -> pd.DataFrame:
    return pd.DataFrame({"item_id": ITEM_IDS, "title": [TITLES[i] for i in ITEM_IDS]})


def save_tiny_model(target: Path, seed: int = 0) -> Path:
    """A random tiny Qwen2 + catalog-trained tokenizer with the SID tokens, as sft saves it."""
    from models.lm import add_sid_tokens, build_tiny, train_tokenizer
    from models.prompts import seq_rec_prompt

    texts = [*TITLES.values(), seq_rec_prompt([]), "The user interacted with . Next item:"] * 3
    tokenizer = train_tokenizer(texts, 300)
    add_sid_tokens(tokenizer, LEVELS, CODES)
    model = build_tiny(
        tokenizer,
        hidden_size=16,
        layers=1,
        heads=2,
        kv_heads=1,
        intermediate_size=32,
        max_length=64,
        seed=seed,
    )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def write_project(settings: Settings, *, grpo_model: bool = False) -> None:
    """Validated catalog + interactions, SID map and the SFT (and optionally GRPO) model."""
    paths = settings.paths
    rows = [
        (user, item, 1_600_000_000 + 10 * k)
        for user, items in USERS.items()
        for k, item in enumerate(items)
    ]
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"])
    with AtomicOutputs() as out:
        out.parquet(catalog(), paths.validated("items"), ITEMS)
        out.parquet(inter, paths.validated("interactions"), INTERACTIONS)
    atomic_write_json(paths.sid_map, SID_MAP)
    save_tiny_model(paths.sft_model, seed=0)
    if grpo_model:
        save_tiny_model(paths.grpo_model, seed=1)


def evaluate_project(settings: Settings) -> dict[str, Any]:
    """split → baselines → evaluate on the tiny project: a real ``metrics/eval.json`` with
    per-user scores and fingerprints of today's files. Returns the report."""
    from tasks.baselines import baselines
    from tasks.evaluate import evaluate
    from tasks.split import split

    split(settings)
    baselines(settings)
    return evaluate(settings).metrics
