"""MLflow tracking: one run per stage execution under the experiment ``sidrec-<dataset>``.

Embedded default ``sqlite:///mlflow.db`` (artifacts under ``./mlruns``) unless
``MLFLOW_TRACKING_URI`` points at a server. Called from task wrappers only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (MLflow params are flat)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, child in value.items():
            out |= flatten(f"{prefix}.{key}" if prefix else str(key), child)
        return out
    return {prefix: value}


def log_stage(
    *,
    dataset: str,
    stage: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    artifacts: Sequence[Path] = (),
) -> str:
    """Log one stage run; returns its MLflow run id."""
    import mlflow

    logging.getLogger("alembic").setLevel(logging.WARNING)  # database migrations on first use
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(f"sidrec-{dataset}")
    with mlflow.start_run(
        run_name=stage, tags={"sidrec.stage": stage, "sidrec.dataset": dataset}
    ) as run:
        mlflow.log_params(flatten("", params))
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        for path in artifacts:
            mlflow.log_artifact(str(path))
    log.info("logged %s to MLflow run %s (%s)", stage, run.info.run_id, tracking_uri())
    return str(run.info.run_id)
