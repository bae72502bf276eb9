"""Prefect glue shared by the task wrappers and flows: cache keys, retry rules, artifacts.

Only task wrappers and flows import this module; stage functions stay Prefect-free.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from prefect.states import State

from sidrec.errors import SidrecError
from sidrec.stage import Stage, stage_fingerprint


@dataclass
class StageCache(CachePolicy):
    """Cache key = the stage's params + the content of its input files + the project code.

    A re-run with unchanged inputs reuses the persisted result; flows then check that the
    outputs on disk are still the ones recorded (see ``flows.common.run_stage``).
    """

    stage: Stage = "ingest"

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        settings = (inputs or {}).get("settings")
        if settings is None:
            return None
        return f"{self.stage}-{stage_fingerprint(self.stage, settings)}"


def retry_unless_user_error(task: Any, task_run: Any, state: State) -> bool:
    """Retry transient failures (I/O, crashes), never bad input or bad configuration."""
    try:
        state.result()
    except SidrecError:
        return False
    except Exception:
        return True
    return True


def artifact_key(kind: str, dataset: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{kind}-{dataset}".lower()).strip("-")


def publish_table(kind: str, dataset: str, rows: list[dict[str, Any]], description: str) -> None:
    create_table_artifact(table=rows, key=artifact_key(kind, dataset), description=description)


def publish_stats(kind: str, dataset: str, stats: Mapping[str, Any], description: str) -> None:
    """A two-column (stat, value) table: the numbers a stage reports, one per row."""
    rows = [{"stat": name, "value": str(value)} for name, value in stats.items()]
    publish_table(kind, dataset, rows, description)


def publish_markdown(kind: str, dataset: str, markdown: str, description: str) -> None:
    create_markdown_artifact(
        markdown=markdown, key=artifact_key(kind, dataset), description=description
    )
