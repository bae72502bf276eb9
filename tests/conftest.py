"""Shared fixtures: a throw-away project folder with the repo's params.yaml, tiny datasets."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sidrec.config import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# real MiniOneRec files, trimmed (see its README.md for the origin)
MINIONEREC_SAMPLE = FIXTURES / "minionerec-sample"

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Prefect's home (ephemeral database, persisted task results) in a throw-away folder
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="sidrec-prefect-")
# MLflow tracking in a throw-away SQLite database (artifacts land in each test's cwd)
os.environ["MLFLOW_TRACKING_URI"] = (
    f"sqlite:///{tempfile.mkdtemp(prefix='sidrec-mlflow-')}/mlflow.db"
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder (cwd) holding a copy of the repo's params.yaml."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def make_settings(root: Path, /, **sections: dict) -> Settings:
    """Settings from the project's params.yaml with some sections' keys replaced."""
    overrides = [
        f"{sec}.{key}={yaml.safe_dump(val, default_flow_style=True).strip()}"
        for sec, kv in sections.items()
        for key, val in kv.items()
    ]
    return load_settings(root / "params.yaml", overrides)


def write_csv_dataset(
    folder: Path, interactions: str | None = None, items: str | None = None
) -> tuple[Path, Path]:
    """A small valid CSV dataset (3 users x 4 interactions, 4 items) unless text is given."""
    folder.mkdir(parents=True, exist_ok=True)
    if interactions is None:
        rows = ["user_id,item_id,timestamp,rating"]
        for u in range(1, 4):
            for k, item in enumerate(["a", "b", "c", "d"]):
                rows.append(f"u{u},{item},{1_600_000_000 + 100 * u + k},{(u + k) % 5 + 1}")
        interactions = "\n".join(rows) + "\n"
    if items is None:
        items = "item_id,title,description\na,Alpha,First\nb,Beta,Second\nc,Gamma,Third\nd,Delta,Fourth\n"
    inter_path, items_path = folder / "interactions.csv", folder / "items.csv"
    inter_path.write_text(interactions)
    items_path.write_text(items)
    return inter_path, items_path


def csv_settings(
    project: Path, inter: Path, items: Path, dataset: str = "tiny", **extra: dict
) -> Settings:
    return make_settings(
        project,
        project={"dataset": dataset},
        ingest={"source": "csv", "interactions": str(inter), "items": str(items)},
        validate={"min_user_interactions": 3},
        **extra,
    )


@pytest.fixture
def files_under(project: Path):
    """Snapshot of files under a folder (relative paths → mtime) to assert nothing changed."""

    def snapshot(sub: str = "data") -> dict[str, float]:
        root = project / sub
        return (
            {
                str(p.relative_to(project)): p.stat().st_mtime_ns
                for p in root.rglob("*")
                if p.is_file()
            }
            if root.exists()
            else {}
        )

    return snapshot


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server (SQLite) for the whole session."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.testing.utilities import prefect_test_harness

    ensure_logging_setup()  # bind Prefect's console handler to the real stderr, not a CliRunner stream

    with prefect_test_harness(server_startup_timeout=120):
        yield


def write_validated_catalog(settings: Settings, n_items: int) -> list[str]:
    """``data/validated/<ds>/items.parquet`` with ``n_items`` titled items (for embed/sids tests)."""
    import pandas as pd

    from sidrec.io import AtomicOutputs
    from sidrec.schemas import ITEMS

    topics = ["space", "love", "war", "crime", "music", "sport", "food", "travel"]
    items = pd.DataFrame(
        {
            "item_id": [f"i{k}" for k in range(n_items)],
            "title": [f"A film about {topics[k % len(topics)]} number {k}" for k in range(n_items)],
            "genres": [topics[k % len(topics)] for k in range(n_items)],
        }
    )
    with AtomicOutputs() as out:
        out.parquet(items, settings.paths.validated("items"), ITEMS)
    return items["item_id"].tolist()


def write_embeddings(settings: Settings, emb, item_ids: list[str]) -> None:
    """``item_emb.npy`` + manifest as the embed stage writes them, from a given matrix."""
    import numpy as np

    from sidrec.io import atomic_write_json
    from tasks.embed import catalog_fingerprint

    settings.paths.item_emb.parent.mkdir(parents=True, exist_ok=True)
    np.save(settings.paths.item_emb, np.asarray(emb, dtype=np.float32))
    atomic_write_json(
        settings.paths.item_emb_manifest,
        {
            "items": len(item_ids),
            "dim": int(np.shape(emb)[1]),
            "item_ids_sha256": catalog_fingerprint(item_ids),
        },
    )
