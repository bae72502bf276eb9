"""Flow ``train-recommender``: baselines → sft → grpo → evaluate (the SID models next to
popularity and SASRec)."""

from __future__ import annotations

from prefect import flow

from flows.common import run_steps
from sidrec.config import Settings
from sidrec.stage import Stage, StageResult
from tasks.baselines import baselines_task
from tasks.evaluate import evaluate_task
from tasks.grpo import grpo_task
from tasks.sft import sft_task


@flow(name="train-recommender")
def train_recommender(settings: Settings, until: Stage = "evaluate") -> dict[str, StageResult]:
    """Train the SASRec baseline (GRPO's collaborative reward, evaluate's baseline row),
    fine-tune the language model on the SIDs, refine it with GRPO (unless ``grpo.enabled`` is
    false), then evaluate every model against the baselines."""
    grpo = [grpo_task] if settings.grpo.enabled else []
    return run_steps([baselines_task, sft_task, *grpo, evaluate_task], settings, until)
