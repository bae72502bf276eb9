"""The promotion gate against a real SQLite MLflow store, and the register stage end to end."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import mlflow
import pytest

from sidrec.errors import InputError
from sidrec.registry import (
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    TAG_CHAMPION_VALUE,
    TAG_CHAMPION_VERSION,
    TAG_DECISION,
    TAG_GATE_METRIC,
    TAG_GATE_VALUE,
    TAG_REASON,
    decide,
    metric_tag,
    register_and_gate,
)
from sidrec.tracking import tracking_uri
from tasks.register import decision_markdown, register, summary_line
from tests.tiny_recommender import tiny_settings, write_eval, write_project

GATE = "test.ndcg@10"
# Every test uses the session's SQLite store (tests/conftest.py: creating one costs seconds)
# and registers under its own model name.
NAME = ""


class Echo(mlflow.pyfunc.PythonModel):
    """Stands in for the recommender where only the registry is under test."""

    def predict(self, context, model_input, params=None):
        return model_input


@pytest.fixture(autouse=True)
def model_name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "sidrec-" + re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")
    monkeypatch.setattr(sys.modules[__name__], "NAME", name)
    return name


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> mlflow.MlflowClient:
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment("registry-test")
    return mlflow.MlflowClient(tracking_uri())


def _gate(client: mlflow.MlflowClient, value: float | None, margin: float = 0.0, **kw: Any):
    with mlflow.start_run() as run:
        # explicit (empty) requirements: inferring them would load the model in a subprocess
        info = mlflow.pyfunc.log_model(name="m", python_model=Echo(), pip_requirements=[])
    metrics = {"test.hr@10": 0.5} if value is None else {GATE: value, "test.hr@10": 0.5}
    return register_and_gate(
        client,
        model_name=NAME,
        model_uri=info.model_uri,
        run_id=run.info.run_id,
        model_id=info.model_id,
        gate_metric=GATE,
        metrics=metrics,
        min_margin=margin,
        **kw,
    )


def _aliases(client: mlflow.MlflowClient, name: str | None = None) -> dict[str, str]:
    return {a: str(v) for a, v in client.get_registered_model(name or NAME).aliases.items()}


def _registered(name: str) -> bool:
    return bool(mlflow.MlflowClient().search_registered_models(f"name = '{name}'"))


def test_decide() -> None:
    assert decide(candidate=0.1, champion=None, has_champion=False, min_margin=0.5)[0]
    assert decide(candidate=0.2, champion=0.1, has_champion=True, min_margin=0.05)[0]
    assert not decide(candidate=0.12, champion=0.1, has_champion=True, min_margin=0.05)[0]
    assert not decide(candidate=0.1, champion=0.1, has_champion=True, min_margin=0.0)[0]
    promoted, reason = decide(candidate=0.9, champion=None, has_champion=True, min_margin=0)
    assert not promoted and "no recorded value" in reason


def test_first_version_becomes_champion(client: mlflow.MlflowClient) -> None:
    d = _gate(client, 0.10, tags={"sidrec.dataset": "tiny"})
    assert (d.version, d.promoted, d.champion_version, d.champion_value) == ("1", True, None, None)
    assert d.aliases == (CHALLENGER, CHAMPION)
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "1"}
    tags = client.get_model_version(NAME, "1").tags
    assert tags[TAG_GATE_METRIC] == GATE and float(tags[TAG_GATE_VALUE]) == 0.10
    assert float(tags[metric_tag("test.hr@10")]) == 0.5
    assert tags[TAG_DECISION] == "promoted" and tags[TAG_REASON] == "no champion yet"
    assert tags["sidrec.dataset"] == "tiny" and tags[TAG_CHAMPION_VERSION] == ""


def test_better_candidate_is_promoted_and_old_champion_becomes_previous(
    client: mlflow.MlflowClient,
) -> None:
    _gate(client, 0.10)
    d = _gate(client, 0.12)
    assert d.promoted and (d.champion_version, d.champion_value) == ("1", 0.10)
    assert _aliases(client) == {CHAMPION: "2", CHALLENGER: "2", PREVIOUS: "1"}
    tags = client.get_model_version(NAME, "2").tags
    assert tags[TAG_DECISION] == "promoted"
    assert (tags[TAG_CHAMPION_VERSION], float(tags[TAG_CHAMPION_VALUE])) == ("1", 0.10)
    assert mlflow.pyfunc.load_model(f"models:/{NAME}@champion").metadata.run_id == (
        client.get_model_version(NAME, "2").run_id
    )


def test_worse_candidate_is_not_promoted(client: mlflow.MlflowClient) -> None:
    _gate(client, 0.10)
    d = _gate(client, 0.08)
    assert not d.promoted and d.aliases == (CHALLENGER,)
    assert "<= champion" in d.reason
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "2"}
    tags = client.get_model_version(NAME, "2").tags
    assert tags[TAG_DECISION] == "rejected" and float(tags[TAG_CHAMPION_VALUE]) == 0.10


def test_margin_is_respected(client: mlflow.MlflowClient) -> None:
    _gate(client, 0.10)
    assert not _gate(client, 0.105, margin=0.01).promoted  # better, but not by the margin
    assert _aliases(client)[CHAMPION] == "1"
    assert _gate(client, 0.115, margin=0.01).promoted
    assert _aliases(client) == {CHAMPION: "3", CHALLENGER: "3", PREVIOUS: "1"}


@pytest.mark.parametrize("value", [None, math.nan, math.inf])
def test_missing_or_bad_gate_metric_moves_nothing(client: mlflow.MlflowClient, value) -> None:
    _gate(client, 0.10)
    with pytest.raises(InputError, match="test.ndcg@10"):
        _gate(client, value)
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "1"}
    assert [str(v.version) for v in client.search_model_versions(f"name='{NAME}'")] == ["1"]


def test_failure_while_registering_moves_no_alias(client: mlflow.MlflowClient) -> None:
    _gate(client, 0.10)

    class Failing:
        """The real client, except that tagging the new version fails (e.g. server gone)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def set_model_version_tag(self, *args: Any) -> None:
            raise ConnectionError("tracking server went away")

    with pytest.raises(ConnectionError):
        _gate(Failing(), 0.50)  # type: ignore[arg-type]
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "1"}


def test_champion_without_recorded_metric_is_kept(client: mlflow.MlflowClient) -> None:
    _gate(client, 0.10)
    for key in (metric_tag(GATE), TAG_GATE_VALUE):
        client.delete_model_version_tag(NAME, "1", key)
    d = _gate(client, 0.90)
    assert not d.promoted and "no recorded value" in d.reason
    assert _aliases(client)[CHAMPION] == "1"


# --- the register stage (tasks/register.py) on a tiny model ---------------------------------


@pytest.fixture
def tiny(project: Path, model_name: str):
    settings = tiny_settings(project, register={"model_name": model_name})
    write_project(settings)
    return settings


def test_register_stage_promotes_then_gates(tiny) -> None:
    write_eval(tiny, sft={"hr@10": 0.3, "ndcg@10": 0.10})
    first = register(tiny).metrics
    assert (first["model_name"], first["version"], first["promoted"]) == (NAME, "1", True)
    assert first["candidate"] == "sft" and first["candidate_value"] == 0.10
    assert json.loads(tiny.paths.metrics("register").read_text()) == json.loads(json.dumps(first))
    assert (
        summary_line(first)
        == f"{NAME} v1 (sft) · promoted to champion · {GATE} 0.1000 vs no champion before"
    )
    assert "**champion**" in decision_markdown(first)

    write_eval(tiny, sft={"hr@10": 0.3, "ndcg@10": 0.05})
    second = register(tiny).metrics
    assert (second["version"], second["promoted"], second["champion_value"]) == ("2", False, 0.10)
    assert second["aliases"] == [CHALLENGER]
    assert summary_line(second).endswith("not promoted · test.ndcg@10 0.0500 vs champion v1 0.1000")
    assert _aliases(mlflow.MlflowClient()) == {CHAMPION: "1", CHALLENGER: "2"}
    run = mlflow.MlflowClient().get_run(second["run_id"])
    assert (
        run.data.tags["sidrec.stage"] == "register" and run.data.metrics["test.ndcg_at_10"] == 0.05
    )


def test_register_auto_prefers_grpo_and_needs_its_eval_row(project: Path) -> None:
    settings = tiny_settings(project, grpo={"enabled": True}, register={"model_name": NAME})
    write_project(settings, grpo_model=True)
    write_eval(settings, sft={"ndcg@10": 0.10})  # evaluation older than the GRPO model
    with pytest.raises(InputError, match="no 'test' row for model 'grpo'"):
        register(settings)
    assert not _registered(NAME)  # nothing was logged
    write_eval(settings, sft={"ndcg@10": 0.10}, grpo={"ndcg@10": 0.2})
    m = register(settings).metrics
    assert (m["candidate"], m["candidate_value"], m["promoted"]) == ("grpo", 0.2, True)


def test_register_stage_errors_before_logging(tiny) -> None:
    with pytest.raises(InputError, match="run `sidrec evaluate` first"):
        register(tiny)
    write_eval(tiny, sft={"hr@10": 0.3})
    with pytest.raises(InputError, match=r"no 'test.ndcg@10'.*model 'sft'"):
        register(tiny)
    assert not _registered(NAME)


def test_register_disabled_logs_nothing(project: Path) -> None:
    settings = tiny_settings(project, register={"enabled": False, "model_name": NAME})
    write_project(settings)
    write_eval(settings, sft={"ndcg@10": 0.1})
    result = register(settings)
    assert result.metrics["skipped"] is True
    assert summary_line(result.metrics) == "skipped (register.enabled is false)"
    assert json.loads(settings.paths.metrics("register").read_text())["skipped"] is True
    assert not _registered(NAME)
