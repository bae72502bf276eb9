"""Flow ``prepare-data``: ingest → validate → split."""

from __future__ import annotations

from prefect import flow

from flows.common import run_stage
from sidrec.config import Settings
from sidrec.stage import STAGES, Stage, StageResult
from tasks.ingest import ingest_task
from tasks.split import split_task
from tasks.validate import validate_task


@flow(name="prepare-data", log_prints=False)
def prepare_data(settings: Settings, until: Stage = "split") -> dict[str, StageResult]:
    """Raw tables, validated tables and splits for ``settings.project.dataset``."""
    stop = STAGES.index(until)
    results = {"ingest": run_stage(ingest_task, settings)}
    if stop >= STAGES.index("validate"):
        results["validate"] = run_stage(validate_task, settings)
    if stop >= STAGES.index("split"):
        results["split"] = run_stage(split_task, settings)
    return results
