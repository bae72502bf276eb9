"""Flow ``build-sids``: embed → sids."""

from __future__ import annotations

from prefect import flow

from flows.common import run_steps
from sidrec.config import Settings
from sidrec.stage import Stage, StageResult
from tasks.embed import embed_task
from tasks.sids import sids_task


@flow(name="build-sids")
def build_sids(settings: Settings, until: Stage = "sids") -> dict[str, StageResult]:
    """Item embeddings, then the collision-free SID map for ``settings.project.dataset``."""
    return run_steps([embed_task, sids_task], settings, until)
