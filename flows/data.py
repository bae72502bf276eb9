"""Flow ``prepare-data``: ingest → validate → split."""

from __future__ import annotations

from prefect import flow

from flows.common import run_steps
from sidrec.config import Settings
from sidrec.stage import Stage, StageResult
from tasks.ingest import ingest_task
from tasks.split import split_task
from tasks.validate import validate_task


@flow(name="prepare-data", log_prints=False)
def prepare_data(settings: Settings, until: Stage = "split") -> dict[str, StageResult]:
    """Raw tables, validated tables and splits for ``settings.project.dataset``."""
    return run_steps([ingest_task, validate_task, split_task], settings, until)
