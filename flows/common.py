"""Helpers the flows share."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

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


def summary_rows(results: dict[str, StageResult]) -> list[tuple[str, str]]:
    """(stage, one-line summary) per stage, for the CLI's closing table."""
    return [(name, _highlights(r)) for name, r in results.items()]


def _highlights(result: StageResult) -> str:
    m = result.metrics
    if result.stage in ("ingest", "validate"):
        return f"{m['users']:,} users · {m['items']:,} items · {m['interactions']:,} interactions"
    if result.stage == "split":
        return " · ".join(f"{k} {m[k]['rows']:,}" for k in ("train", "valid", "test"))
    if result.stage == "embed":
        return f"{m['items']:,} items · dim {m['dim']} · {m['encoded']:,} encoded, {m['from_cache']:,} cached"
    if result.stage == "sids":
        return (
            f"{m['items']:,} SIDs x {m['levels']} levels · collisions {m['collision_rate_before']:.4f} "
            f"→ {m['collision_rate_after']:.4f} · level-1 usage {m['level_usage'][0]['usage']:.0%}"
        )
    if result.stage == "baselines":
        return (
            f"SASRec max_len {m['max_len']} · best epoch {m['best_epoch']} of {m['epochs_run']} · "
            f"valid-selection NDCG@10 {m['valid_selection']['ndcg@10']:.4f} · {m['seconds']:.0f} s"
        )
    if result.stage == "sft":
        return f"{m['train_examples']:,} examples · {m['steps']} steps · eval loss {m['eval_loss']:.3f}"
    if result.stage == "grpo":
        start, best = m["valid_start"]["ndcg@10"], m["valid_best"]["ndcg@10"]
        return (
            f"{m['steps']} steps · {m['rollout']} rollouts x {m['num_generations']} · "
            f"valid NDCG@10 {start:.4f} → {best:.4f} (step {m['best_step']})"
        )
    if result.stage == "register":
        from tasks.register import summary_line

        return summary_line(m)
    if result.stage == "evaluate":
        from tasks.evaluate import summary_line as evaluate_line

        return evaluate_line(m)
    return ""
