"""A tiny recommender project on disk, in seconds: catalog, interactions, SID map, a randomly
initialized tiny model folder and ``metrics/eval.json`` — what the register stage, the pyfunc
model and ``sidrec recommend`` read. (Random weights: tests assert structure, not quality.)"""

from __future__ import annotations

import json
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
USERS = {"u1": ["i0", "i1", "i2", "i3"], "u2": ["i5", "i4"], "u3": ["i7", "i8", "i9", "i10", "i11"]}


def tiny_overrides(**sections: dict[str, Any]) -> list[str]:
    """``--set`` overrides of the tiny project (``sections`` replace or add keys)."""
    base: dict[str, dict[str, Any]] = {
        "project": {"dataset": "tiny"},
        "model": {"max_length": 64},
        "split": {"max_history": 3},
        "grpo": {"enabled": False},
        "register": {"top_k": 5, "num_beams": 5},
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


def write_eval(settings: Settings, **rows: dict[str, float]) -> None:
    """``metrics/eval.json`` with the given model rows (``sft={"ndcg@10": 0.1}``) on both splits."""
    report: dict[str, Any] = {"dataset": settings.project.dataset, "ks": [1, 5, 10]}
    for split in ("valid", "test"):
        report[split] = {"popularity": {"hr@10": 0.01, "ndcg@10": 0.005}, **rows}
    path = settings.paths.metrics("eval")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
