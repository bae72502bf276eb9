"""Flow ``batch-recommend``: top-K for every user from the registered champion, written to
``data/processed/<ds>/recommendations.parquet`` (user_id, rank, item_id, title, score)."""

from __future__ import annotations

from prefect import flow, get_run_logger

from sidrec.config import load_settings
from sidrec.distributed import require_one_process
from tasks.recommend import batch_recommend_task


@flow(name="batch-recommend")
def batch_recommend(
    config_path: str = "params.yaml",
    overrides: list[str] | None = None,
    k: int = 10,
    batch_size: int = 64,
) -> str:
    """Load ``params.yaml`` (+ ``section.key=value`` overrides) and write every user's top-``k``;
    returns the Parquet file's path."""
    require_one_process("the batch-recommend flow", "run it as one process")
    settings = load_settings(config_path, overrides or [])
    path = batch_recommend_task(settings, k=k, batch_size=batch_size)
    get_run_logger().info("recommendations for %s written to %s", settings.project.dataset, path)
    return path
