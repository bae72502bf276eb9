"""Flow ``train-recommender``: sft → evaluate (the SFT model next to popularity and SASRec)."""

from __future__ import annotations

from prefect import flow

from flows.common import run_stage
from sidrec.config import Settings
from sidrec.stage import StageResult
from tasks.evaluate import evaluate_task
from tasks.sft import sft_task


@flow(name="train-recommender")
def train_recommender(settings: Settings, until: str = "evaluate") -> dict[str, StageResult]:
    """Fine-tune the language model on the SIDs, then evaluate it against the baselines."""
    results = {"sft": run_stage(sft_task, settings)}
    if until != "sft":
        results["evaluate"] = run_stage(evaluate_task, settings)
    return results
