"""The promotion gate against a real SQLite MLflow store, and the register stage end to end."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import mlflow
import pytest

from sidrec.config import load_settings
from sidrec.errors import ConfigError, InputError
from sidrec.registry import (
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    TAG_CHAMPION_VALUE,
    TAG_CHAMPION_VERSION,
    TAG_DECISION,
    TAG_DIFF_LOW,
    TAG_GATE_METRIC,
    TAG_GATE_VALUE,
    TAG_REASON,
    Comparison,
    decide,
    metric_tag,
    register_and_gate,
    rejections_in_a_row,
)
from sidrec.tracking import tracking_uri
from tasks.register import decision_markdown, register, summary_line

REPO = Path(__file__).resolve().parents[2]
GATE = "valid.ndcg@10"
# Every test uses the session's SQLite store (tests/conftest.py: creating one costs seconds)
# and registers under its own model name.
NAME = ""


def _comparison(ours: float, theirs: float | None, low: float | None = None) -> Comparison:
    """Challenger ``ours`` vs champion ``theirs`` with a paired interval [low, low + 0.02]."""
    if theirs is None:
        return Comparison(GATE, ours, None, None, None, 0.95, 40)
    low = ours - theirs - 0.01 if low is None else low
    return Comparison(GATE, ours, theirs, low, low + 0.02, 0.95, 40)


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


def _gate(client: mlflow.MlflowClient, comparison: Comparison, margin: float = 0.0, **kw: Any):
    with mlflow.start_run() as run:
        # explicit (empty) requirements: inferring them would load the model in a subprocess
        info = mlflow.pyfunc.log_model(name="m", python_model=Echo(), pip_requirements=[])
    before = client.get_registered_model(NAME).aliases.get(CHAMPION) if _registered(NAME) else None
    return register_and_gate(
        client,
        model_name=NAME,
        model_uri=info.model_uri,
        comparison=comparison,
        champion_before=None if before is None else str(before),
        metrics={GATE: comparison.challenger, "test.hr@10": 0.5},
        min_margin=margin,
        run_id=run.info.run_id,
        model_id=info.model_id,
        **kw,
    )


def _aliases(client: mlflow.MlflowClient, name: str | None = None) -> dict[str, str]:
    return {a: str(v) for a, v in client.get_registered_model(name or NAME).aliases.items()}


def _registered(name: str) -> bool:
    return bool(mlflow.MlflowClient().search_registered_models(f"name = '{name}'"))


def test_decide_needs_the_paired_lower_bound_above_the_margin() -> None:
    assert decide(_comparison(0.1, None), has_champion=False, min_margin=0.5) == (
        True,
        "no champion yet",
    )
    assert decide(_comparison(0.2, 0.1, low=0.01), has_champion=True, min_margin=0.0)[0]
    assert not decide(_comparison(0.2, 0.1, low=0.01), has_champion=True, min_margin=0.02)[0]
    # a higher mean inside the noise is not enough
    promoted, reason = decide(_comparison(0.12, 0.1, low=-0.003), has_champion=True, min_margin=0)
    assert not promoted and "beyond the noise" in reason and "[-0.003" in reason
    # the same model twice: every difference is 0, the lower bound is 0, nothing moves
    assert not decide(_comparison(0.1, 0.1, low=0.0), has_champion=True, min_margin=0.0)[0]


def test_first_version_becomes_champion(client: mlflow.MlflowClient) -> None:
    d = _gate(client, _comparison(0.10, None), tags={"sidrec.dataset": "tiny"})
    assert (d.version, d.promoted, d.champion_version, d.champion_value) == ("1", True, None, None)
    assert d.aliases == (CHALLENGER, CHAMPION)
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "1"}
    tags = client.get_model_version(NAME, "1").tags
    assert tags[TAG_GATE_METRIC] == GATE and float(tags[TAG_GATE_VALUE]) == 0.10
    assert float(tags[metric_tag("test.hr@10")]) == 0.5
    assert tags[TAG_DECISION] == "promoted" and tags[TAG_REASON] == "no champion yet"
    assert tags["sidrec.dataset"] == "tiny" and tags[TAG_CHAMPION_VERSION] == ""


def test_better_beyond_the_noise_is_promoted_and_old_champion_becomes_previous(
    client: mlflow.MlflowClient,
) -> None:
    _gate(client, _comparison(0.10, None))
    d = _gate(client, _comparison(0.12, 0.10, low=0.005))
    assert d.promoted and (d.champion_version, d.champion_value) == ("1", 0.10)
    assert _aliases(client) == {CHAMPION: "2", CHALLENGER: "2", PREVIOUS: "1"}
    tags = client.get_model_version(NAME, "2").tags
    assert tags[TAG_DECISION] == "promoted" and float(tags[TAG_DIFF_LOW]) == 0.005
    assert (tags[TAG_CHAMPION_VERSION], float(tags[TAG_CHAMPION_VALUE])) == ("1", 0.10)
    assert mlflow.pyfunc.load_model(f"models:/{NAME}@champion").metadata.run_id == (
        client.get_model_version(NAME, "2").run_id
    )


def test_worse_or_within_noise_is_not_promoted(client: mlflow.MlflowClient) -> None:
    _gate(client, _comparison(0.10, None))
    d = _gate(client, _comparison(0.08, 0.10))
    assert not d.promoted and d.aliases == (CHALLENGER,)
    assert _gate(client, _comparison(0.11, 0.10, low=-0.001)).promoted is False
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "3"}
    tags = client.get_model_version(NAME, "2").tags
    assert tags[TAG_DECISION] == "rejected" and float(tags[TAG_CHAMPION_VALUE]) == 0.10


def test_a_veto_keeps_a_better_candidate_out(client: mlflow.MlflowClient) -> None:
    """The register stage's check against the best baseline vetoes a promotion the champion
    comparison would allow; the reason is recorded, the champion stays."""
    first = _gate(client, _comparison(0.10, None), veto="below the best baseline")
    assert (first.promoted, first.reason, first.aliases) == (
        False,
        "below the best baseline",
        (CHALLENGER,),
    )
    _gate(client, _comparison(0.10, None))  # v2: champion
    d = _gate(client, _comparison(0.12, 0.10, low=0.005), veto="below the best baseline")
    assert not d.promoted and d.reason == "below the best baseline"
    both = _gate(client, _comparison(0.08, 0.10), veto="below the best baseline")
    assert not both.promoted and both.reason.endswith("beyond the noise; below the best baseline")
    assert _aliases(client) == {CHAMPION: "2", CHALLENGER: "4"}
    assert client.get_model_version(NAME, "3").tags[TAG_DECISION] == "rejected"


def test_rejections_in_a_row_count_back_to_the_last_promotion(
    client: mlflow.MlflowClient,
) -> None:
    assert rejections_in_a_row(client, NAME) == 0  # no such model yet
    _gate(client, _comparison(0.10, None))  # v1: promoted
    assert rejections_in_a_row(client, NAME) == 0
    _gate(client, _comparison(0.08, 0.10))
    _gate(client, _comparison(0.09, 0.10))
    assert rejections_in_a_row(client, NAME) == 2
    # a version registered by hand (no gate decision) neither counts nor ends the streak
    with mlflow.start_run() as run:
        info = mlflow.pyfunc.log_model(name="m", python_model=Echo(), pip_requirements=[])
    client.create_model_version(NAME, source=info.model_uri, run_id=run.info.run_id)
    _gate(client, _comparison(0.09, 0.10))
    assert rejections_in_a_row(client, NAME) == 3
    _gate(client, _comparison(0.20, 0.10, low=0.05))  # v6: promoted, the streak ends
    assert rejections_in_a_row(client, NAME) == 0
    _gate(client, _comparison(0.10, 0.20))
    assert rejections_in_a_row(client, NAME) == 1


def test_margin_is_respected(client: mlflow.MlflowClient) -> None:
    _gate(client, _comparison(0.10, None))
    assert not _gate(client, _comparison(0.2, 0.1, low=0.005), margin=0.01).promoted
    assert _aliases(client)[CHAMPION] == "1"
    assert _gate(client, _comparison(0.2, 0.1, low=0.015), margin=0.01).promoted
    assert _aliases(client) == {CHAMPION: "3", CHALLENGER: "3", PREVIOUS: "1"}


def test_a_champion_that_moved_while_scoring_moves_nothing(client: mlflow.MlflowClient) -> None:
    _gate(client, _comparison(0.10, None))
    with mlflow.start_run() as run:
        info = mlflow.pyfunc.log_model(name="m", python_model=Echo(), pip_requirements=[])
    with pytest.raises(InputError, match="champion of .* moved"):
        register_and_gate(
            client,
            model_name=NAME,
            model_uri=info.model_uri,
            comparison=_comparison(0.5, None),
            champion_before=None,  # scored as if there were no champion
            metrics={},
            min_margin=0.0,
            run_id=run.info.run_id,
        )
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "1"}


def test_a_champion_moved_by_another_registration_meanwhile_is_not_replaced(
    client: mlflow.MlflowClient,
) -> None:
    _gate(client, _comparison(0.10, None))  # v1 champion

    class Racing:
        """The real client; while this version is tagged, another run promotes v2."""

        raced = False

        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def set_model_version_tag(self, name: str, version: str, key: str, value: str) -> None:
            client.set_model_version_tag(name, version, key, value)
            if version == "3" and not self.raced:
                self.raced = True
                client.set_registered_model_alias(name, CHAMPION, "2")

    _gate(client, _comparison(0.05, 0.10))  # v2, rejected: the other run's version
    with pytest.raises(InputError, match=r"champion of .* moved \(v1 → v2\) while v3"):
        _gate(Racing(), _comparison(0.5, 0.1, low=0.3))  # type: ignore[arg-type]
    assert _aliases(client)[CHAMPION] == "2" and PREVIOUS not in _aliases(client)
    assert client.get_model_version(NAME, "3").tags[TAG_DECISION] == "failed"


@pytest.mark.parametrize(
    ("comparison", "margin", "match"),
    [
        (_comparison(0.5, 0.1, low=0.3), -0.01, "min_margin must be a finite number >= 0"),
        (_comparison(0.5, 0.1, low=0.3), float("nan"), "min_margin must be a finite number"),
        (_comparison(float("nan"), None), 0.0, r"candidate's valid.ndcg@10 is nan"),
    ],
)
def test_bad_gate_inputs_register_nothing(
    client: mlflow.MlflowClient, comparison: Comparison, margin: float, match: str
) -> None:
    with pytest.raises(InputError, match=match):
        _gate(client, comparison, margin)
    assert not _registered(NAME)


def test_a_champion_that_could_not_be_scored_is_not_replaced() -> None:
    unscored = Comparison(GATE, 0.5, None, None, None, 0.95, 40)
    assert decide(unscored, has_champion=True, min_margin=0.0) == (
        False,
        "the champion could not be scored on the gate users",
    )
    assert decide(unscored, has_champion=False, min_margin=0.0) == (True, "no champion yet")


def test_failure_while_registering_moves_no_alias(client: mlflow.MlflowClient) -> None:
    _gate(client, _comparison(0.10, None))

    class Failing:
        """The real client, except that tagging the new version fails (e.g. server gone)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def set_model_version_tag(self, *args: Any) -> None:
            raise ConnectionError("tracking server went away")

    with pytest.raises(ConnectionError):
        _gate(Failing(), _comparison(0.5, 0.1, low=0.3))  # type: ignore[arg-type]
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "1"}


def test_a_champion_alias_that_fails_to_move_records_no_promotion(
    client: mlflow.MlflowClient,
) -> None:
    _gate(client, _comparison(0.10, None))  # v1
    _gate(client, _comparison(0.20, 0.10, low=0.05))  # v2: champion, v1 previous
    _gate(client, _comparison(0.05, 0.20))  # v3: rejected

    class Failing:
        """The real client, except that moving ``champion`` fails (e.g. server gone)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
            if alias == CHAMPION:
                raise ConnectionError("tracking server went away")
            client.set_registered_model_alias(name, alias, version)

    with pytest.raises(ConnectionError):
        _gate(Failing(), _comparison(0.5, 0.2, low=0.3))  # type: ignore[arg-type]
    # champion and previous where they were; the failed version does not end the streak
    assert _aliases(client) == {CHAMPION: "2", PREVIOUS: "1", CHALLENGER: "4"}
    assert client.get_model_version(NAME, "4").tags[TAG_DECISION] == "failed"
    assert rejections_in_a_row(client, NAME) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("test.ndcg@10", "would choose the model on the test split.*'valid.ndcg@10'"),
        ("valid.mrr@10", "unknown gate metric 'valid.mrr@10'"),
        ("train.ndcg@10", "unknown gate metric"),
    ],
)
def test_gate_metric_must_be_a_validation_metric(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(REPO / "params.yaml", [f"register.gate_metric={value}"])


# --- the register stage (tasks/register.py) on a tiny model, evaluated for real --------------


@pytest.fixture
def tiny(project: Path, model_name: str, tiny_project):
    settings = tiny_project.settings(project, register={"model_name": model_name})
    tiny_project.write(settings)
    tiny_project.evaluate(settings)
    return settings


def test_register_stage_promotes_then_keeps_the_same_model_out(tiny) -> None:
    first = register(tiny).metrics
    assert (first["model_name"], first["version"], first["promoted"]) == (NAME, "1", True)
    report = json.loads(tiny.paths.metrics("eval").read_text())
    assert first["candidate"] == "sft"
    assert first["candidate_value"] == pytest.approx(report["valid"]["sft"]["ndcg@10"])
    assert json.loads(tiny.paths.metrics("register").read_text()) == json.loads(json.dumps(first))
    assert summary_line(first).startswith(f"{NAME} v1 (sft) · promoted to champion · {GATE}")
    assert "**champion**" in decision_markdown(first)
    assert first["rejections_in_a_row"] == 0

    # the same model again: re-scored champion == challenger on every user → not promoted
    second = register(tiny).metrics
    assert (second["version"], second["promoted"]) == ("2", False)
    assert second["champion_value"] == pytest.approx(first["candidate_value"])
    assert (second["diff_low"], second["diff_high"]) == (0.0, 0.0)
    assert "not promoted" in summary_line(second) and second["rejections_in_a_row"] == 1
    assert "| gate rejections in a row | 1 |" in decision_markdown(second)
    assert _aliases(mlflow.MlflowClient()) == {CHAMPION: "1", CHALLENGER: "2"}
    tags = mlflow.MlflowClient().get_model_version(NAME, "2").tags
    assert tags[TAG_DECISION] == "rejected" and tags["sidrec.fingerprint.split"]
    run = mlflow.MlflowClient().get_run(second["run_id"])
    assert run.data.tags["sidrec.stage"] == "register" and "valid.ndcg_at_10" in run.data.metrics


def test_the_served_model_answers_what_evaluate_ranked(tiny, tiny_project) -> None:
    """The registered pyfunc, given a test user's history up to the target, returns exactly the
    ranking evaluate scored for that user (same recommender, beams and exclusion)."""
    import pandas as pd

    histories = tiny_project.users
    register(tiny)
    served = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    users = pd.read_parquet(tiny.paths.eval_users)
    ranked = users[(users["split"] == "test") & (users["model"] == "sft")]
    for user, ranking in zip(ranked["user_id"], ranked["ranking"], strict=True):
        answer = served.predict(pd.DataFrame({"history": [histories[user][:-1]]}), params={"k": 10})
        assert list(answer["item_ids"].iloc[0]) == list(ranking), user
        assert not set(ranking) & set(histories[user][:-1])  # seen items excluded


def test_register_refuses_metrics_of_another_model_folder(tiny, tiny_model) -> None:
    tiny_model(tiny.paths.sft_model, seed=7)  # retrained after evaluate ran
    with pytest.raises(InputError, match="not computed from today's the sft model folder"):
        register(tiny)
    assert not _registered(NAME)  # nothing was logged


def test_register_refuses_metrics_of_another_split(tiny) -> None:
    from sidrec.io import read_table
    from sidrec.schemas import SPLIT

    train = read_table(tiny.paths.split("train"), SPLIT, "train")
    train.head(len(train) - 1).to_parquet(tiny.paths.split("train"))
    with pytest.raises(InputError, match="split.*re-run `sidrec evaluate`"):
        register(tiny)
    assert not _registered(NAME)


def test_register_refuses_an_evaluation_of_another_dataset_or_sid_map(tiny) -> None:
    path = tiny.paths.metrics("eval")
    report = json.loads(path.read_text())
    path.write_text(json.dumps({**report, "dataset": "other"}))
    with pytest.raises(InputError, match="evaluation is of dataset 'other', not"):
        register(tiny)
    path.write_text(json.dumps(report))
    sid_map = tiny.paths.sid_map
    sid_map.write_text(sid_map.read_text() + "\n")  # any change to the map's bytes
    with pytest.raises(InputError, match="not computed from today's the SID map"):
        register(tiny)
    assert not _registered(NAME)


def test_register_refuses_per_user_scores_of_other_users(tiny) -> None:
    import pandas as pd

    path = tiny.paths.eval_users
    users = pd.read_parquet(path)
    valid_sft = users.index[(users["split"] == "valid") & (users["model"] == "sft")]
    users.loc[valid_sft[0], "user_id"] = "someone-else"
    users.to_parquet(path)
    with pytest.raises(InputError, match="per-user scores of 'sft' are not of today's gate"):
        register(tiny)
    users.drop(columns=["ndcg@10"]).to_parquet(path)
    with pytest.raises(InputError, match="no per-user 'ndcg@10' scores"):
        register(tiny)
    assert not _registered(NAME)


def test_a_champion_that_cannot_be_loaded_moves_nothing(tiny, client) -> None:
    _gate(client, _comparison(0.10, None))  # champion v1: an Echo model, no recommender files
    with pytest.raises(InputError, match="v1 holds no model folder"):
        register(tiny)
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: "1"}


@pytest.mark.parametrize("picked", ["grpo", "sft"])
def test_register_auto_registers_the_model_evaluate_picked(
    project: Path, tiny_project, picked: str
) -> None:
    """Not GRPO whenever it ran: the SID model evaluate picked."""
    settings = tiny_project.settings(project, grpo={"enabled": True}, register={"model_name": NAME})
    tiny_project.write(settings, grpo_model=True)
    with pytest.raises(InputError, match="run `sidrec evaluate` first"):
        register(settings)
    tiny_project.evaluate(settings)
    path = settings.paths.metrics("eval")
    report = json.loads(path.read_text())
    path.write_text(json.dumps({**report, "best_generative": picked}))
    m = register(settings).metrics
    assert (m["candidate"], m["promoted"]) == (picked, True)
    assert m["candidate_value"] == pytest.approx(report["valid"][picked]["ndcg@10"])
    path.write_text(json.dumps({**report, "best_generative": None}))
    with pytest.raises(InputError, match="names no SID model to register"):
        register(settings)


def test_register_disabled_logs_nothing(project: Path, tiny_project) -> None:
    settings = tiny_project.settings(project, register={"enabled": False, "model_name": NAME})
    tiny_project.write(settings)
    result = register(settings)
    assert result.metrics["skipped"] is True
    assert summary_line(result.metrics) == "skipped (register.enabled is false)"
    assert json.loads(settings.paths.metrics("register").read_text())["skipped"] is True
    assert not _registered(NAME)


def test_a_cached_registration_the_registry_lost_is_registered_again(
    tiny, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect import flow

    from flows.common import run_stage
    from sidrec.registry import holds_version
    from sidrec.stage import stage_fingerprint
    from tasks.register import register_task

    @flow
    def register_flow(settings):
        return run_stage(register_task, settings)

    first = register_flow(tiny).metrics
    assert register_flow(tiny).metrics["run_id"] == first["run_id"]  # served from the cache
    # the store lost the version (reset, or cleaned by hand): the cached result is stale
    mlflow.MlflowClient().delete_model_version(NAME, first["version"])
    again = register_flow(tiny).metrics
    assert again["run_id"] != first["run_id"] and again["promoted"]
    assert holds_version(NAME, again["version"], again["run_id"])
    assert _aliases(mlflow.MlflowClient()) == {
        CHAMPION: again["version"],
        CHALLENGER: again["version"],
    }
    # another store is another cache key
    key = stage_fingerprint("register", tiny)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    assert stage_fingerprint("register", tiny) != key


def test_a_store_failure_is_not_read_as_no_champion(client: mlflow.MlflowClient) -> None:
    from mlflow.exceptions import MlflowException

    from sidrec.registry import champion_version

    assert champion_version(client, NAME) is None  # no such model
    client.create_registered_model(NAME)
    assert champion_version(client, NAME) is None  # no champion alias yet

    class Down:
        def get_model_version_by_alias(self, name: str, alias: str) -> None:
            raise MlflowException("server error", error_code="TEMPORARILY_UNAVAILABLE")

    with pytest.raises(MlflowException, match="server error"):
        champion_version(Down(), NAME)


def test_the_gate_ranks_an_unknown_history_by_popularity_as_serving_does(
    tiny, tmp_path: Path
) -> None:
    import pandas as pd

    from models.pyfunc import Recommender
    from sidrec.registry import client, download_version
    from tasks.register import rescore

    assert register(tiny).metrics["promoted"]
    files = download_version(client(), NAME, "1", tmp_path / "champion")
    served = Recommender.from_files(
        model_dir=files.model_dir,
        sid_map=files.sid_map,
        catalog=files.catalog,
        generation=files.generation,
    )
    order = [served.item_ids[i] for i in served.popular(1, served.n_items)[0][0]]
    # histories of items the champion never saw: nothing left to prompt with
    gate = pd.DataFrame(
        {"user_id": ["a", "b"], "history": [["new-1"], ["new-2", "new-3"]], "target": order[:2]}
    )
    scores, dropped, unknown = rescore(tiny, files, gate, [[], [order[0]]])
    # the most popular item first; for b, after its seen item is excluded, the second
    assert scores.tolist() == [1.0, 1.0] and (dropped, unknown) == (3, 0)


# --- the check against evaluate's best baseline (register.gate_best_baseline) ---------------


def _set_gate_scores(settings, model: str, values: Any) -> None:
    """Rewrite evaluate's per-user gate-half ``ndcg@10`` of ``model`` (a number or, per user,
    the scores of another model's name)."""
    import pandas as pd

    path = settings.paths.eval_users
    users = pd.read_parquet(path)
    rows = (users["split"] == "valid") & (users["model"] == model)
    if isinstance(values, str):
        source = (users["split"] == "valid") & (users["model"] == values)
        values = users.loc[source, "ndcg@10"].to_numpy()
    users.loc[rows, "ndcg@10"] = values
    users.to_parquet(path)


def _without_baseline_check(settings):
    return settings.model_copy(
        update={"register_": settings.register_.model_copy(update={"gate_best_baseline": False})}
    )


def test_a_candidate_below_the_best_baseline_is_registered_but_not_promoted(tiny) -> None:
    assert tiny.register_.gate_best_baseline  # on by default
    baseline = json.loads(tiny.paths.metrics("eval").read_text())["best_baseline"]
    _set_gate_scores(tiny, baseline, 1.0)
    _set_gate_scores(tiny, "sft", 0.0)
    m = register(tiny).metrics
    # no champion yet, so the champion comparison alone would promote it
    assert (m["version"], m["promoted"], m["champion_version"]) == ("1", False, None)
    assert m["gate_best_baseline"] is True
    assert m["best_baseline"] == {
        "name": baseline,
        "value": 1.0,
        "low": -1.0,
        "high": -1.0,
        "refuses": True,
    }
    assert m["reason"] == (
        f"valid.ndcg@10 trails the best baseline {baseline} (1): paired 95% interval of "
        f"candidate − {baseline} [-1, -1] over 5 gate users lies below 0 "
        "(register.gate_best_baseline)"
    )
    assert _aliases(mlflow.MlflowClient()) == {CHALLENGER: "1"}  # no champion
    tags = mlflow.MlflowClient().get_model_version(NAME, "1").tags
    assert tags[TAG_DECISION] == "rejected" and tags["sidrec.best_baseline"] == baseline
    assert float(tags["sidrec.best_baseline_diff_high"]) == -1.0
    assert f"not promoted (below the best baseline {baseline})" in summary_line(m)
    assert "[-1.0000, -1.0000]: below 0: refuses promotion |" in decision_markdown(m)
    assert json.loads(tiny.paths.metrics("register").read_text()) == json.loads(json.dumps(m))

    # the setting off: the same candidate is promoted, the interval still reported
    off = register(_without_baseline_check(tiny)).metrics
    assert (off["version"], off["promoted"], off["reason"]) == ("2", True, "no champion yet")
    assert off["best_baseline"]["refuses"] is False and off["best_baseline"]["high"] == -1.0
    assert "(register.gate_best_baseline is off)" in decision_markdown(off)
    assert _aliases(mlflow.MlflowClient()) == {CHAMPION: "2", CHALLENGER: "2"}


def test_below_the_best_baseline_the_champion_stays_even_where_the_candidate_beats_it(
    tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    baseline = json.loads(tiny.paths.metrics("eval").read_text())["best_baseline"]
    _set_gate_scores(tiny, "sft", baseline)  # level with the baseline: not below it
    first = register(tiny).metrics
    assert first["promoted"] and (
        first["best_baseline"]["low"],
        first["best_baseline"]["high"],
    ) == (
        0.0,
        0.0,
    )
    assert first["best_baseline"]["refuses"] is False

    # the candidate now beats the (re-scored) champion beyond the noise, but trails the baseline
    _set_gate_scores(tiny, baseline, 1.0)
    _set_gate_scores(tiny, "sft", 0.5)
    monkeypatch.setattr(
        "tasks.register.rescore", lambda settings, files, gate, seen: (np.zeros(len(gate)), 0, 0)
    )
    second = register(tiny).metrics
    assert not second["promoted"] and second["diff_low"] == 0.5  # beats the champion …
    assert second["best_baseline"]["refuses"]  # … but not the baseline
    assert second["reason"].startswith(f"valid.ndcg@10 trails the best baseline {baseline}")
    assert _aliases(mlflow.MlflowClient()) == {CHAMPION: "1", CHALLENGER: "2"}


def test_the_baseline_check_needs_an_evaluation_that_names_the_best_baseline(tiny) -> None:
    path = tiny.paths.metrics("eval")
    report = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in report.items() if k != "best_baseline"}))
    with pytest.raises(InputError, match="names no best baseline .*re-run `sidrec evaluate`"):
        register(tiny)
    assert not _registered(NAME)
    m = register(_without_baseline_check(tiny)).metrics
    assert m["promoted"] and m["best_baseline"] is None
    assert "| candidate − best baseline | not checked |" in decision_markdown(m)


def test_the_baseline_check_refuses_scores_of_other_baselines(tiny) -> None:
    """Baselines re-chosen after evaluate ran: their scores in the evaluation are stale."""
    choice = json.loads(tiny.paths.ease_choice.read_text())
    tiny.paths.ease_choice.write_text(json.dumps({**choice, "alpha": 123.0}))
    with pytest.raises(InputError, match="not computed from today's EASE choice of the baselines"):
        register(tiny)
    assert not _registered(NAME)
    assert register(_without_baseline_check(tiny)).metrics["promoted"]  # not compared then
