"""The model registry's promotion gate.

A logged model becomes a new version of the registered model; the version gets alias
``challenger``; it becomes ``champion`` only if its gate metric (e.g. ``test.ndcg@10``) beats the
current champion's by more than ``min_margin`` (or there is no champion yet), and the champion
it replaces gets ``previous``. Every version carries its evaluation metrics as tags
(:func:`metric_tag`), so the next candidate can be compared with it even after the gate metric
is changed in the configuration; the decision, both values and the reason are tags too.

Failure safety: every check (the candidate's metric present and finite, the version created)
happens before any alias moves, and aliases move last, ``champion`` the very last; so a run that
fails anywhere leaves ``champion`` where it was.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sidrec.errors import InputError
from sidrec.tracking import metric_key

log = logging.getLogger(__name__)

CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
TAG_GATE_METRIC = "sidrec.gate_metric"
"""The gate metric this version was judged on (``test.ndcg@10``)."""
TAG_GATE_VALUE = "sidrec.gate_value"
"""This version's value of the gate metric."""
TAG_DECISION = "sidrec.decision"
"""``promoted`` or ``rejected``."""
TAG_REASON = "sidrec.reason"
TAG_CHAMPION_VERSION = "sidrec.champion_version_before"
"""The champion this version was compared with (empty: there was none)."""
TAG_CHAMPION_VALUE = "sidrec.champion_value_before"
METRIC_TAG_PREFIX = "sidrec.metric."


class GateDecision(NamedTuple):
    model_name: str
    version: str
    """The new model version."""
    promoted: bool
    reason: str
    gate_metric: str
    candidate_value: float
    champion_version: str | None
    """The champion before this decision (None: there was none)."""
    champion_value: float | None
    """Its gate metric (None: no champion, or it has no recorded value)."""
    min_margin: float
    aliases: tuple[str, ...]
    """The new version's aliases after the decision."""


def metric_tag(metric: str) -> str:
    """Version tag holding an evaluation metric: ``test.ndcg@10`` → ``sidrec.metric.test.ndcg_at_10``."""
    return METRIC_TAG_PREFIX + metric_key(metric)


def decide(
    *, candidate: float, champion: float | None, has_champion: bool, min_margin: float
) -> tuple[bool, str]:
    """(promote?, reason). Promote when there is no champion or the candidate beats it by more
    than ``min_margin``; a champion without a recorded value is never replaced automatically."""
    if not has_champion:
        return True, "no champion yet"
    if champion is None:
        return False, (
            "the champion has no recorded value of the gate metric, so the candidate cannot be "
            "compared with it; set the champion's metric tag or move the alias by hand"
        )
    if candidate > champion + min_margin:
        return True, f"{candidate:.6g} > champion {champion:.6g} + margin {min_margin:g}"
    return False, f"{candidate:.6g} <= champion {champion:.6g} + margin {min_margin:g}"


def candidate_value(metrics: Mapping[str, Any], gate_metric: str) -> float:
    """The candidate's gate metric, checked present and finite (InputError otherwise)."""
    if gate_metric not in metrics:
        raise InputError(
            f"the candidate has no {gate_metric!r} (it has {sorted(metrics)}); "
            "re-run `sidrec evaluate` or change register.gate_metric"
        )
    try:
        value = float(metrics[gate_metric])
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise InputError(
            f"the candidate's {gate_metric!r} is {metrics[gate_metric]!r}, not a finite number; "
            "re-run `sidrec evaluate`"
        )
    return value


def register_and_gate(
    client: Any,
    *,
    model_name: str,
    model_uri: str,
    gate_metric: str,
    metrics: Mapping[str, Any],
    min_margin: float,
    run_id: str | None = None,
    model_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> GateDecision:
    """Register ``model_uri`` as a new version of ``model_name`` and gate its promotion.

    ``client``: an ``mlflow.MlflowClient``. ``metrics``: the candidate's evaluation metrics,
    keyed like ``gate_metric`` (``test.ndcg@10``); all are stored as version tags. ``tags``:
    further version tags (dataset, candidate stage, ...).
    """
    value = candidate_value(metrics, gate_metric)  # before anything is written
    if min_margin < 0 or not math.isfinite(min_margin):
        raise InputError(f"min_margin must be a finite number >= 0, got {min_margin}")
    _ensure_registered_model(client, model_name)
    champion_version = _aliases(client, model_name).get(CHAMPION)
    champion_value = (
        recorded_value(client.get_model_version(model_name, champion_version), gate_metric)
        if champion_version is not None
        else None
    )
    version_tags = {
        **(tags or {}),
        **{metric_tag(k): str(v) for k, v in metrics.items() if _is_number(v)},
        TAG_GATE_METRIC: gate_metric,
        TAG_GATE_VALUE: str(value),
    }
    created = client.create_model_version(
        name=model_name, source=model_uri, run_id=run_id, tags=version_tags, model_id=model_id
    )
    version = str(created.version)
    if created.status != "READY":  # MLflow waits for READY and raises on a failed registration
        raise InputError(
            f"model version {model_name} v{version} is {created.status}, not READY; "
            "no alias was moved"
        )
    promoted, reason = decide(
        candidate=value,
        champion=champion_value,
        has_champion=champion_version is not None,
        min_margin=min_margin,
    )
    decision_tags = {
        TAG_DECISION: "promoted" if promoted else "rejected",
        TAG_REASON: reason,
        TAG_CHAMPION_VERSION: champion_version or "",
        TAG_CHAMPION_VALUE: "" if champion_value is None else str(champion_value),
    }
    for key, tag_value in decision_tags.items():
        client.set_model_version_tag(model_name, version, key, tag_value)
    _move_aliases(client, model_name, version, champion_version if promoted else None, promoted)
    decision = GateDecision(
        model_name=model_name,
        version=version,
        promoted=promoted,
        reason=reason,
        gate_metric=gate_metric,
        candidate_value=value,
        champion_version=champion_version,
        champion_value=champion_value,
        min_margin=min_margin,
        aliases=tuple(sorted(_version_aliases(client, model_name, version))),
    )
    log.info(
        "%s v%s %s (%s: %s)",
        model_name,
        version,
        "promoted to champion" if promoted else "not promoted",
        gate_metric,
        reason,
    )
    return decision


def recorded_value(model_version: Any, gate_metric: str) -> float | None:
    """A version's recorded value of ``gate_metric`` (None when it has none or it is not a number)."""
    tags = model_version.tags or {}
    raw = tags.get(metric_tag(gate_metric))
    if raw is None and tags.get(TAG_GATE_METRIC) == gate_metric:
        raw = tags.get(TAG_GATE_VALUE)
    try:
        value = float(raw) if raw is not None else math.nan
    except ValueError:
        value = math.nan
    return value if math.isfinite(value) else None


def _move_aliases(
    client: Any, name: str, version: str, replaced: str | None, promoted: bool
) -> None:
    """challenger → the new version; if promoted, previous → the replaced champion and, last,
    champion → the new version (a failure before that last call leaves champion unchanged)."""
    client.set_registered_model_alias(name, CHALLENGER, version)
    if not promoted:
        return
    if replaced is not None:
        client.set_registered_model_alias(name, PREVIOUS, replaced)
    client.set_registered_model_alias(name, CHAMPION, version)


def _ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            raise
        client.create_registered_model(
            name, description="sidrec recommender (semantic-ID generation, constrained beams)"
        )


def _aliases(client: Any, name: str) -> dict[str, str]:
    """alias → version of a registered model."""
    return {alias: str(v) for alias, v in (client.get_registered_model(name).aliases or {}).items()}


def _version_aliases(client: Any, name: str, version: str) -> list[str]:
    return [alias for alias, v in _aliases(client, name).items() if v == version]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def champion_version(client: Any, name: str) -> str | None:
    """The version behind ``name@champion``; None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException:
        return None


def download_champion_model(client: Any, name: str, dest: Path) -> Path | None:
    """Download the champion's model folder (the ``model`` artifact of the pyfunc) under
    ``dest``; returns the folder that holds ``config.json``, or None without a champion."""
    import mlflow

    version = champion_version(client, name)
    if version is None:
        return None
    local = Path(
        mlflow.artifacts.download_artifacts(f"models:/{name}/{version}", dst_path=str(dest))
    )
    found = sorted(
        p.parent
        for p in local.rglob("config.json")
        if (p.parent / "tokenizer_config.json").exists()
    )
    if not found:
        raise InputError(
            f"champion {name} v{version} holds no model folder (config.json + tokenizer)",
            path=local,
        )
    return found[0]
