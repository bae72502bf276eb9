"""Alerts: the event the register task emits after each gate decision, and the Prefect
automations (flows/automations.py) that react to it and to failed retrain runs. Triggers are
checked with the Prefect server's own matching (``EventTrigger.covers``); creating them runs
against the session's Prefect test server."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prefect.events import Event
from typer.testing import CliRunner

from flows.automations import (
    GATE_REJECTIONS,
    RETRAIN_FAILED,
    apply,
    gate_rejections_trigger,
    notification_block,
    retrain_failed_trigger,
    sidrec_automations,
)
from sidrec.errors import ConfigError
from sidrec.orchestration import (
    MODEL_PROMOTED,
    MODEL_REJECTED,
    REJECTIONS_LABEL,
    emit_gate_event,
    gate_event,
)


def decision(*, promoted: bool, in_a_row: int, name: str = "sidrec-tiny") -> dict[str, Any]:
    """A register report (metrics/register.json) as far as the event reads it."""
    return {
        "dataset": "tiny",
        "skipped": False,
        "model_name": name,
        "version": "7",
        "candidate": "grpo",
        "promoted": promoted,
        "reason": "valid.ndcg@10 ... not above the margin 0 beyond the noise",
        "gate_metric": "valid.ndcg@10",
        "candidate_value": 0.081,
        "champion_version": "4",
        "champion_value": 0.083,
        "diff_low": -0.01,
        "diff_high": 0.006,
        "model_uri": "models:/m-1",
        "rejections_in_a_row": in_a_row,
    }


def covers(trigger: Any, event: Event) -> bool:
    """Whether the Prefect server would count ``event`` for ``trigger``."""
    from prefect.server.events.schemas.automations import EventTrigger as ServerTrigger
    from prefect.server.events.schemas.events import ReceivedEvent

    server_trigger = ServerTrigger.model_validate(trigger.model_dump(mode="json"))
    return server_trigger.covers(ReceivedEvent.model_validate(event.model_dump(mode="json")))


def flow_run_event(state: str, deployment: str | None) -> Event:
    """A flow-run state event as the server emits it (prefect/server/models/events.py)."""
    related = [
        {"prefect.resource.id": f"prefect.flow.{uuid.uuid4()}", "prefect.resource.role": "flow",
         "prefect.resource.name": "retrain"},
    ]  # fmt: skip
    if deployment is not None:
        related.append(
            {"prefect.resource.id": f"prefect.deployment.{uuid.uuid4()}",
             "prefect.resource.role": "deployment", "prefect.resource.name": deployment}
        )  # fmt: skip
    return Event(
        event=f"prefect.flow-run.{state}",
        resource={"prefect.resource.id": f"prefect.flow-run.{uuid.uuid4()}",
                  "prefect.resource.name": "brave-fox", "prefect.state-name": state},
        related=related,
    )  # fmt: skip


# ---------------------------------------------------------------- the gate's event


def test_the_gate_event_names_the_outcome_and_the_streak():
    promoted = Event(**gate_event(decision(promoted=True, in_a_row=0)))
    assert promoted.event == MODEL_PROMOTED
    assert promoted.resource.id == "sidrec.model.sidrec-tiny"
    assert promoted.resource[REJECTIONS_LABEL] == "0"
    rejected = Event(**gate_event(decision(promoted=False, in_a_row=3)))
    assert rejected.event == MODEL_REJECTED and rejected.resource[REJECTIONS_LABEL] == "3"
    assert rejected.payload["reason"].endswith("beyond the noise")
    assert rejected.payload["champion_version"] == "4" and rejected.payload["version"] == "7"
    assert gate_event({"dataset": "tiny", "skipped": True, "reason": "disabled"}) is None


def test_the_rejections_automation_fires_when_the_streak_reaches_n():
    trigger = gate_rejections_trigger(3)

    def rejected(n: int, name: str = "sidrec-tiny") -> Event:
        return Event(**gate_event(decision(promoted=False, in_a_row=n, name=name)))

    assert covers(trigger, rejected(3)) and covers(trigger, rejected(3, name="sidrec-other"))
    assert not covers(trigger, rejected(2))
    assert not covers(trigger, rejected(4))  # once per streak, not at every later rejection
    assert not covers(trigger, Event(**gate_event(decision(promoted=True, in_a_row=0))))
    assert (trigger.posture, trigger.threshold) == ("Reactive", 1)
    with pytest.raises(ConfigError, match="at least 1"):
        gate_rejections_trigger(0)


def test_the_failure_automation_covers_failed_runs_of_its_deployments_only():
    trigger = retrain_failed_trigger(["retrain-weekly"])
    for state in ("Failed", "Crashed", "TimedOut"):
        assert covers(trigger, flow_run_event(state, "retrain-weekly")), state
    assert not covers(trigger, flow_run_event("Completed", "retrain-weekly"))
    assert not covers(trigger, flow_run_event("Cancelled", "retrain-weekly"))
    assert not covers(trigger, flow_run_event("Failed", "retrain-manual"))
    assert not covers(trigger, flow_run_event("Failed", None))  # `sidrec pipeline` by hand
    both = retrain_failed_trigger(["retrain-weekly", "retrain-manual"])
    assert covers(both, flow_run_event("Failed", "retrain-manual"))
    with pytest.raises(ConfigError, match="at least one deployment"):
        retrain_failed_trigger([])


def test_without_a_block_the_automations_fire_but_notify_nobody():
    quiet = sidrec_automations(notify=None)
    assert [a.name for a in quiet] == [RETRAIN_FAILED, GATE_REJECTIONS]
    assert [[action.type for action in a.actions] for a in quiet] == [["do-nothing"]] * 2
    block = uuid.uuid4()
    loud = sidrec_automations(notify=block, rejections=5)
    for automation in loud:
        (action,) = automation.actions
        assert action.type == "send-notification" and action.block_document_id == block
    assert loud[1].trigger.match[REJECTIONS_LABEL] == ["5"]
    assert "{{ event.payload.reason }}" in loud[1].actions[0].body
    assert "{{ flow_run|ui_url }}" in loud[0].actions[0].body


@pytest.fixture
def sent_events(
    monkeypatch: pytest.MonkeyPatch, prefect_harness: None
) -> Iterator[Callable[[], list[Event]]]:
    """The events emitted in the test, as Prefect's asserting events client received them
    (after the test server's start, which binds Prefect's logging to the real stderr)."""
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker

    worker = EventsWorker.instance(AssertingEventsClient)
    monkeypatch.setattr(EventsWorker, "instance", lambda *_: worker)

    def received() -> list[Event]:
        worker.drain()
        assert AssertingEventsClient.last is not None
        return AssertingEventsClient.last.events

    yield received
    AssertingEventsClient.reset()


def test_emitting_the_gate_event_sends_it(sent_events):
    sent = emit_gate_event(decision(promoted=False, in_a_row=2))
    assert emit_gate_event({"skipped": True}) is None
    (event,) = sent_events()
    assert sent is not None and event.id == sent.id
    assert event.event == MODEL_REJECTED and event.resource[REJECTIONS_LABEL] == "2"


# ---------------------------------------------------------------- on a Prefect server


def test_automations_are_created_then_updated_in_place(prefect_harness):
    from prefect.blocks.notifications import SlackWebhook
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client

    from sidrec.cli import app

    first = apply(sidrec_automations(notify=None))
    assert [how for _, how in first] == ["created", "created"]
    ids = [a.id for a, _ in first]

    block_name = f"alerts-{uuid.uuid4().hex[:8]}"
    SlackWebhook(url="https://hooks.slack.com/services/T0/B0/xyz").save(block_name)
    block = notification_block(f"slack-webhook/{block_name}")
    result = CliRunner().invoke(
        app, ["automations", "--notify", f"slack-webhook/{block_name}", "--rejections", "4"]
    )
    assert result.exit_code == 0, result.output
    assert "updated" in result.output and "created" not in result.output
    with get_client(sync_client=True) as client:
        stored = {
            name: client.read_automations_by_name(name)
            for name in (RETRAIN_FAILED, GATE_REJECTIONS)
        }
    assert [a.id for (a,) in stored.values()] == ids  # updated, not duplicated
    (rejections,) = stored[GATE_REJECTIONS]
    (action,) = rejections.actions
    assert action.type == "send-notification" and action.block_document_id == block
    assert rejections.trigger.match[REJECTIONS_LABEL] == ["4"]

    Secret(value="s3cret").save(f"not-a-notifier-{block_name}")
    with pytest.raises(ConfigError, match="cannot send notifications"):
        notification_block(f"secret/not-a-notifier-{block_name}")
    with pytest.raises(ConfigError, match="no block 'slack-webhook/missing'"):
        notification_block("slack-webhook/missing")
    with pytest.raises(ConfigError, match="<block-type>/<name>"):
        notification_block(block_name)


def test_automations_need_a_prefect_server():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from sidrec.cli import app

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        result = CliRunner().invoke(app, ["automations"])
    assert result.exit_code == 1 and "set PREFECT_API_URL" in result.output


def test_an_unreachable_prefect_api_is_a_clear_error(project, sidrec_subprocess_env, free_port):
    import subprocess
    import sys

    port = free_port()
    env = {**sidrec_subprocess_env(project), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    proc = subprocess.run(
        [sys.executable, "-m", "sidrec", "automations"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"cannot reach http://127.0.0.1:{port}/api" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
