"""Flow ``build-sids``: embed → sids."""

from __future__ import annotations

from prefect import flow

from flows.common import run_stage
from sidrec.config import Settings
from sidrec.stage import StageResult
from tasks.embed import embed_task
from tasks.sids import sids_task


@flow(name="build-sids")
def build_sids(settings: Settings, until: str = "sids") -> dict[str, StageResult]:
    """Item embeddings, then the collision-free SID map for ``settings.project.dataset``."""
    results = {"embed": run_stage(embed_task, settings)}
    if until != "embed":
        results["sids"] = run_stage(sids_task, settings)
    return results
