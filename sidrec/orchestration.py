"""Prefect glue shared by the task wrappers and flows: cache keys, retry rules, artifacts,
the events the automations of ``flows/automations.py`` watch.

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
from prefect.events import Event, emit_event
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


MODEL_PROMOTED = "sidrec.model.promoted"
MODEL_REJECTED = "sidrec.model.rejected"
"""Events the register task emits after each gate decision, about resource
``sidrec.model.<registered model name>``."""
REJECTIONS_LABEL = "sidrec.rejections-in-a-row"
"""Resource label of those events: the gate rejections since the last promotion, this one
included (``sidrec.registry.rejections_in_a_row``), "0" after a promotion."""
GATE_PAYLOAD = (
    "model_name",
    "version",
    "candidate",
    "gate_metric",
    "candidate_value",
    "champion_version",
    "champion_value",
    "diff_low",
    "diff_high",
    "reason",
    "rejections_in_a_row",
    "model_uri",
)
"""Keys of ``metrics/register.json`` the events carry (notification templates read them as
``{{ event.payload.<key> }}``)."""


def gate_event(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The event (``emit_event`` keyword arguments) of a register report; None when
    registration was skipped."""
    if report.get("skipped"):
        return None
    name = report["model_name"]
    return {
        "event": MODEL_PROMOTED if report["promoted"] else MODEL_REJECTED,
        "resource": {
            "prefect.resource.id": f"sidrec.model.{name}",
            "prefect.resource.name": name,
            "sidrec.dataset": str(report["dataset"]),
            "sidrec.version": str(report["version"]),
            REJECTIONS_LABEL: str(report["rejections_in_a_row"]),
        },
        "payload": {key: report.get(key) for key in GATE_PAYLOAD},
    }


def emit_gate_event(report: Mapping[str, Any]) -> Event | None:
    """Emit the gate decision's event (Prefect adds the flow and task run as related
    resources); returns it, or None when none was sent."""
    event = gate_event(report)
    return None if event is None else emit_event(**event)
