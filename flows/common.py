"""Helpers the flows share."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

from prefect import Task

from sidrec.config import Settings, dump_settings
from sidrec.stage import StageResult

log = logging.getLogger(__name__)


def run_stage(stage_task: Task[..., StageResult], settings: Settings) -> StageResult:
    """Run a stage task; if Prefect served it from cache but its outputs were deleted or changed
    on disk since, run it again (the cache key covers inputs, not outputs)."""
    result = stage_task(settings)
    if not result.outputs_intact():
        log.info("%s: cached outputs changed on disk, re-running", result.stage)
        result = stage_task.with_options(refresh_cache=True)(settings)
    return result


def save_run_config(settings: Settings, command: str) -> Path:
    """Save the resolved configuration of this run under ``runs/<UTC time>-<command>/params.yaml``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = settings.project.runs_dir / f"{stamp}-{command}" / "params.yaml"
    dump_settings(settings, path)
    return path


def summary_rows(results: dict[str, StageResult]) -> list[dict[str, Any]]:
    return [{"stage": name, **_highlights(r)} for name, r in results.items()]


def _highlights(result: StageResult) -> dict[str, Any]:
    m = result.metrics
    if result.stage in ("ingest", "validate"):
        return {k: m.get(k) for k in ("users", "items", "interactions")}
    if result.stage == "split":
        return {k: m[k]["rows"] for k in ("train", "valid", "test") if k in m}
    if result.stage == "embed":
        return {"items": m["items"], "dim": m["dim"], "encoded": m["encoded"]}
    return {
        "items": m["items"],
        "levels": m["levels"],
        "collisions before": m["collision_rate_before"],
        "collisions after": m["collision_rate_after"],
    }
