"""Stage 1 — ingest: read the configured source, write ``data/raw/<ds>/{interactions,items}.parquet``."""

from __future__ import annotations

import logging

from prefect import get_run_logger, task

from sidrec.config import Settings
from sidrec.io import AtomicOutputs
from sidrec.orchestration import StageCache, publish_stats, retry_unless_user_error
from sidrec.schemas import INTERACTIONS, ITEMS
from sidrec.sources import read_source
from sidrec.stage import StageResult, dataset_line

log = logging.getLogger(__name__)


def ingest(settings: Settings) -> StageResult:
    """Normalize the source to the raw tables and write ``metrics/ingest.json``."""
    tables = read_source(settings.ingest)
    paths = settings.paths
    inter = tables.interactions
    metrics = {
        "dataset": settings.project.dataset,
        "source": settings.ingest.source,
        "users": int(inter["user_id"].nunique()),
        "items": len(tables.items),
        "interactions": len(inter),
        "sources": {t: [str(p) for p in ps] for t, ps in tables.files.items()},
        "notes": tables.notes,
    }
    outputs = [paths.raw("interactions"), paths.raw("items"), paths.metrics("ingest")]
    with AtomicOutputs() as out:
        out.parquet(inter, outputs[0], INTERACTIONS)
        out.parquet(tables.items, outputs[1], ITEMS)
        out.json(metrics, outputs[2])
    log.info(
        "ingested %s: %d users, %d items, %d interactions",
        metrics["dataset"],
        metrics["users"],
        metrics["items"],
        metrics["interactions"],
    )
    return StageResult.from_files("ingest", outputs, metrics, dataset_line(metrics))


@task(
    name="ingest",
    cache_policy=StageCache(stage="ingest"),
    persist_result=True,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
)
def ingest_task(settings: Settings) -> StageResult:
    result = ingest(settings)
    m = result.metrics
    get_run_logger().info(
        "%d users, %d items, %d interactions", m["users"], m["items"], m["interactions"]
    )
    publish_stats(
        "dataset-stats",
        m["dataset"],
        {**{k: m[k] for k in ("source", "users", "items", "interactions")}, **m["notes"]},
        description=f"Raw tables of {m['dataset']} as ingested",
    )
    return result
