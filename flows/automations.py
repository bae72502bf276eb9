"""Prefect automations of the sidrec deployments: tell someone when a retrain run fails, and
when the promotion gate has rejected N challengers in a row.

``sidrec automations`` creates them on the Prefect server of ``PREFECT_API_URL`` or, when one
of the same name exists, updates it in place: running it again after a change is safe. They
react to events the server and the register task emit:

- **retrain failed**: ``prefect.flow-run.Failed``, ``Crashed`` or ``TimedOut`` of a flow run
  whose deployment is one of the given ones (``retrain-weekly`` by default), matched by the
  name of the run's related deployment resource, so a deployment deployed again under a new
  id is still covered.
- **gate rejections**: ``sidrec.model.rejected`` (``sidrec/orchestration.py``) whose
  ``sidrec.rejections-in-a-row`` label equals N. The register task counts the streak from
  the registry's decision tags, so a promotion resets it; a Prefect threshold of N events
  within a window would count rejections across a promotion. It fires once per streak, when
  it reaches N.

The action is a notification through a Prefect notification block (Slack, Teams, e-mail,
any webhook: ``<block-type>/<name>`` as ``prefect block ls`` lists it), with the run or the
gate decision in its text. Without a block the action is ``DoNothing``: the automation still
fires and shows in the UI (Automations, Event Feed) until a block is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal
from uuid import UUID

from prefect.automations import Automation, DoNothing, EventTrigger, Posture, SendNotification
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL

from sidrec.errors import ConfigError
from sidrec.orchestration import MODEL_REJECTED, REJECTIONS_LABEL

RETRAIN_FAILED = "sidrec: retrain failed"
GATE_REJECTIONS = "sidrec: gate rejections in a row"
"""The automations' names: ``apply`` finds an existing automation by its name."""
FAILED_STATES = ("Failed", "Crashed", "TimedOut")
"""Final flow-run states that mean the retrain did not finish (TimedOut is a Failed state)."""
DEFAULT_DEPLOYMENTS = ("retrain-weekly",)
DEFAULT_REJECTIONS = 3

FAILED_SUBJECT = (
    "sidrec: {{ deployment.name }} run {{ flow_run.name }} ended {{ flow_run.state.name }}"
)
FAILED_BODY = """\
Flow run {{ flow.name }}/{{ flow_run.name }} of deployment {{ deployment.name }} ended \
{{ flow_run.state.name }} at {{ flow_run.state.timestamp }}.

{{ flow_run.state.message }}

Flow run: {{ flow_run|ui_url }}
The champion model did not change: registration comes last and moves it only on success.
"""
REJECTIONS_SUBJECT = (
    "sidrec: the gate rejected {{ event.payload.rejections_in_a_row }} challengers of "
    "{{ event.payload.model_name }} in a row"
)
REJECTIONS_BODY = """\
The promotion gate of {{ event.payload.model_name }} has rejected \
{{ event.payload.rejections_in_a_row }} challengers in a row; the champion is still \
v{{ event.payload.champion_version }}.

Latest: v{{ event.payload.version }} ({{ event.payload.candidate }}), \
{{ event.payload.gate_metric }} {{ event.payload.candidate_value }} against the champion's \
{{ event.payload.champion_value }}: {{ event.payload.reason }}

Worth a look: the drift report of the last loads (Prefect artifact drift-report-<dataset>), \
the training runs in MLflow, the gate's tags on the rejected versions.
"""


def retrain_failed_trigger(deployments: Sequence[str]) -> EventTrigger:
    """Any run of one of ``deployments`` (names, e.g. ``retrain-weekly``) that ends failed."""
    if not deployments:
        raise ConfigError("name at least one deployment whose failed runs should alert")
    return EventTrigger(
        expect={f"prefect.flow-run.{state}" for state in FAILED_STATES},
        match={"prefect.resource.id": "prefect.flow-run.*"},
        match_related={
            "prefect.resource.role": "deployment",
            "prefect.resource.name": list(deployments),
        },
        posture=Posture.Reactive,
        threshold=1,
    )


def gate_rejections_trigger(rejections: int) -> EventTrigger:
    """The rejection that makes the streak of a registered model ``rejections`` long."""
    if rejections < 1:
        raise ConfigError(f"rejections in a row must be at least 1, got {rejections}")
    return EventTrigger(
        expect={MODEL_REJECTED},
        match={"prefect.resource.id": "sidrec.model.*", REJECTIONS_LABEL: str(rejections)},
        posture=Posture.Reactive,
        threshold=1,
    )


def sidrec_automations(
    *,
    notify: UUID | None,
    deployments: Sequence[str] = DEFAULT_DEPLOYMENTS,
    rejections: int = DEFAULT_REJECTIONS,
) -> list[Automation]:
    """The two automations; ``notify`` is the notification block's id (None: DoNothing)."""

    def action(subject: str, body: str) -> SendNotification | DoNothing:
        if notify is None:
            return DoNothing()
        return SendNotification(block_document_id=notify, subject=subject, body=body)

    return [
        Automation(
            name=RETRAIN_FAILED,
            description=f"a run of {' or '.join(deployments)} ends {' or '.join(FAILED_STATES)}",
            trigger=retrain_failed_trigger(deployments),
            actions=[action(FAILED_SUBJECT, FAILED_BODY)],
        ),
        Automation(
            name=GATE_REJECTIONS,
            description=f"the promotion gate rejects a model's challengers {rejections} times "
            "in a row (once per streak)",
            trigger=gate_rejections_trigger(rejections),
            actions=[action(REJECTIONS_SUBJECT, REJECTIONS_BODY)],
        ),
    ]


def require_server() -> str:
    """The Prefect API URL; a ConfigError without one (the ephemeral local API keeps no
    automations and evaluates none once the command exits)."""
    url = PREFECT_API_URL.value()
    if not url:
        raise ConfigError(
            "automations live on a Prefect server: set PREFECT_API_URL (e.g. "
            "http://127.0.0.1:4200/api for the compose stack, docs/operations.md)"
        )
    return str(url)


def notification_block(spec: str) -> UUID:
    """The id of the notification block ``<block-type>/<name>`` (``slack-webhook/alerts``)."""
    block_type, sep, name = spec.partition("/")
    if not (sep and block_type and name):
        raise ConfigError(
            f"notification block {spec!r}: give it as <block-type>/<name>, as `prefect block "
            "ls` lists it (e.g. slack-webhook/sidrec-alerts)"
        )
    url = require_server()
    with get_client(sync_client=True) as client:
        try:
            block = client.read_block_document_by_name(
                name=name, block_type_slug=block_type, include_secrets=False
            )
        except ObjectNotFound:
            raise ConfigError(
                f"no block {spec!r} on the Prefect server at {url}; create it first (UI: "
                "Blocks, or docs/operations.md#alerts for the Python one-liner)"
            ) from None
    capabilities = block.block_schema.capabilities if block.block_schema else []
    if "notify" not in capabilities:
        raise ConfigError(
            f"block {spec!r} cannot send notifications; use a notification block "
            "(slack-webhook, ms-teams-webhook, sendgrid-email, custom-webhook, ...)"
        )
    return block.id


def apply(
    automations: Sequence[Automation],
) -> list[tuple[Automation, Literal["created", "updated"]]]:
    """Create each automation, or update the one of the same name in place."""
    require_server()
    done: list[tuple[Automation, Literal["created", "updated"]]] = []
    for automation in automations:
        with get_client(sync_client=True) as client:
            existing = client.read_automations_by_name(automation.name)
        if existing:
            automation.id = existing[0].id  # the newest of that name
            automation.update()
            done.append((automation, "updated"))
        else:
            automation.create()
            done.append((automation, "created"))
    return done
