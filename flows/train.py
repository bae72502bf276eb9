"""Flow ``train-recommender``: baselines → sft → grpo → evaluate (the SID models next to
popularity and SASRec)."""

from __future__ import annotations

from prefect import flow

from flows.common import run_stage
from sidrec.config import Settings
from sidrec.stage import STAGES, StageResult
from tasks.baselines import baselines_task
from tasks.evaluate import evaluate_task
from tasks.grpo import grpo_task
from tasks.sft import sft_task


@flow(name="train-recommender")
def train_recommender(settings: Settings, until: str = "evaluate") -> dict[str, StageResult]:
    """Train the SASRec baseline (GRPO's collaborative reward, evaluate's baseline row),
    fine-tune the language model on the SIDs, refine it with GRPO (unless ``grpo.enabled`` is
    false), then evaluate every model against the baselines."""
    stop = STAGES.index(until)
    results = {"baselines": run_stage(baselines_task, settings)}
    if stop < STAGES.index("sft"):
        return results
    results["sft"] = run_stage(sft_task, settings)
    if stop >= STAGES.index("grpo") and settings.grpo.enabled:
        results["grpo"] = run_stage(grpo_task, settings)
    if stop >= STAGES.index("evaluate"):
        results["evaluate"] = run_stage(evaluate_task, settings)
    return results
