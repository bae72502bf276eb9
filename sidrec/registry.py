"""The model registry's promotion gate.

A logged model becomes a new version of the registered model and gets alias ``challenger``.
It becomes ``champion`` only when it is better than the current champion **beyond the
noise**: both are scored user by user on the same gate users with today's code and data
(the task layer re-scores the champion's registered weights and SID map), and the lower
bound of the paired bootstrap interval of (challenger − champion) must exceed
``min_margin``. With no champion yet, the first model is promoted. The champion it replaces
gets ``previous``. The decision — both values, the interval, the users, the data
fingerprints and the reason — is stored as version tags.

Failure safety: everything that can fail (the champion's files, the re-scoring, the
candidate's metrics) happens before a version is created; aliases move last, ``champion``
the very last, so a run that fails anywhere leaves ``champion`` where it was.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.tracking import metric_key, require_server, tracking_uri

log = logging.getLogger(__name__)

CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
TAG_GATE_METRIC = "sidrec.gate_metric"
"""The gate metric this version was judged on (``valid.ndcg@10``)."""
TAG_GATE_VALUE = "sidrec.gate_value"
"""This version's mean gate metric on the gate users at registration."""
TAG_DECISION = "sidrec.decision"
"""``promoted`` or ``rejected``; ``failed`` when the aliases could not be moved (the version
was judged promotable but ``champion`` stayed where it was)."""
FAILED = "failed"
TAG_REASON = "sidrec.reason"
TAG_CHAMPION_VERSION = "sidrec.champion_version_before"
"""The champion this version was compared with (empty: there was none)."""
TAG_CHAMPION_VALUE = "sidrec.champion_value_before"
"""That champion's mean gate metric, re-scored on the same users with today's code."""
TAG_DIFF_LOW, TAG_DIFF_HIGH = "sidrec.diff_low", "sidrec.diff_high"
"""The paired bootstrap interval of (challenger − champion)."""
METRIC_TAG_PREFIX = "sidrec.metric."


class Comparison(NamedTuple):
    """Challenger and champion on the same gate users (computed by the register stage)."""

    metric: str
    """The gate metric, ``valid.<hr|ndcg>@K``."""
    challenger: float
    """The challenger's mean over the gate rows (one per user under leave_one_out)."""
    champion: float | None
    """The champion's mean over the same users (None: no champion)."""
    low: float | None
    """Paired bootstrap interval of (challenger − champion), lower bound (None: no champion)."""
    high: float | None
    confidence: float
    users: int
    """Distinct gate users: the bootstrap's resampled unit (a user's rows drawn together)."""
    dropped_history_items: int = 0
    """History items the champion's SID map does not know (dropped from its prompts)."""
    unknown_targets: int = 0
    """Gate targets the champion cannot recommend (counted as misses for it)."""

    def tags(self) -> dict[str, str]:
        return {
            TAG_GATE_METRIC: self.metric,
            TAG_GATE_VALUE: str(self.challenger),
            TAG_CHAMPION_VALUE: "" if self.champion is None else str(self.champion),
            TAG_DIFF_LOW: "" if self.low is None else str(self.low),
            TAG_DIFF_HIGH: "" if self.high is None else str(self.high),
            "sidrec.gate_confidence": str(self.confidence),
            "sidrec.gate_users": str(self.users),
            "sidrec.champion_dropped_history_items": str(self.dropped_history_items),
            "sidrec.champion_unknown_targets": str(self.unknown_targets),
        }


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
    """Its gate metric re-scored on the same users (None: no champion)."""
    diff_low: float | None
    diff_high: float | None
    """Paired bootstrap interval of (candidate − champion)."""
    confidence: float
    gate_users: int
    min_margin: float
    aliases: tuple[str, ...]
    """The new version's aliases after the decision."""


def metric_tag(metric: str) -> str:
    """Version tag holding an evaluation metric: ``test.ndcg@10`` → ``sidrec.metric.test.ndcg_at_10``."""
    return METRIC_TAG_PREFIX + metric_key(metric)


def decide(comparison: Comparison, *, has_champion: bool, min_margin: float) -> tuple[bool, str]:
    """(promote?, reason): promote when there is no champion, or when the paired interval's
    lower bound of (challenger − champion) exceeds ``min_margin`` — better beyond the noise."""
    if not has_champion:
        return True, "no champion yet"
    if comparison.low is None or comparison.high is None or comparison.champion is None:
        return False, "the champion could not be scored on the gate users"
    interval = (
        f"{comparison.metric} challenger − champion {comparison.challenger - comparison.champion:+.4g}, "
        f"paired {comparison.confidence:.0%} interval [{comparison.low:+.4g}, {comparison.high:+.4g}] "
        f"over {comparison.users} gate users"
    )
    if comparison.low > min_margin:
        return True, f"{interval}: the lower bound exceeds the margin {min_margin:g}"
    return False, f"{interval}: not above the margin {min_margin:g} beyond the noise"


def register_and_gate(
    client: Any,
    *,
    model_name: str,
    model_uri: str,
    comparison: Comparison,
    champion_before: str | None,
    metrics: Mapping[str, Any],
    min_margin: float,
    run_id: str | None = None,
    model_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    veto: str | None = None,
) -> GateDecision:
    """Register ``model_uri`` as a new version of ``model_name`` and gate its promotion.

    ``client``: an ``mlflow.MlflowClient``. ``comparison``: the challenger and the champion
    (``champion_before``, looked up before scoring) on the same gate users. ``metrics``: the
    candidate's evaluation metrics (``valid.ndcg@10`` ...), stored as version tags, like
    ``tags`` (dataset, candidate stage, data fingerprints, ...). ``veto``: a reason the
    candidate may not be promoted whatever the champion comparison says (the register
    stage's check against the best baseline); it is registered, not promoted, and the reason
    is recorded.
    """
    if min_margin < 0 or not math.isfinite(min_margin):
        raise InputError(f"min_margin must be a finite number >= 0, got {min_margin}")
    if not math.isfinite(comparison.challenger):
        raise InputError(f"the candidate's {comparison.metric} is {comparison.challenger}")
    _ensure_registered_model(client, model_name)
    current = _aliases(client, model_name).get(CHAMPION)
    if current != champion_before:
        raise InputError(
            f"the champion of {model_name} moved (v{champion_before} → v{current}) while this "
            "candidate was scored; run `sidrec register` again"
        )
    version_tags = {
        **(tags or {}),
        **{metric_tag(k): str(v) for k, v in metrics.items() if _is_number(v)},
        **comparison.tags(),
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
        comparison, has_champion=champion_before is not None, min_margin=min_margin
    )
    if veto is not None:
        reason = veto if promoted else f"{reason}; {veto}"
        promoted = False
    decision_tags = {
        TAG_DECISION: "promoted" if promoted else "rejected",
        TAG_REASON: reason,
        TAG_CHAMPION_VERSION: champion_before or "",
    }
    for key, tag_value in decision_tags.items():
        client.set_model_version_tag(model_name, version, key, tag_value)
    try:
        _move_aliases(client, model_name, version, champion_before if promoted else None, promoted)
    except Exception:  # champion did not move: the version must not read as promoted
        with contextlib.suppress(Exception):  # best effort: the store may be what failed
            client.set_model_version_tag(model_name, version, TAG_DECISION, FAILED)
        raise
    decision = GateDecision(
        model_name=model_name,
        version=version,
        promoted=promoted,
        reason=reason,
        gate_metric=comparison.metric,
        candidate_value=comparison.challenger,
        champion_version=champion_before,
        champion_value=comparison.champion,
        diff_low=comparison.low,
        diff_high=comparison.high,
        confidence=comparison.confidence,
        gate_users=comparison.users,
        min_margin=min_margin,
        aliases=tuple(sorted(_version_aliases(client, model_name, version))),
    )
    log.info(
        "%s v%s %s (%s)",
        model_name,
        version,
        "promoted to champion" if promoted else "not promoted",
        reason,
    )
    return decision


def _move_aliases(
    client: Any, name: str, version: str, replaced: str | None, promoted: bool
) -> None:
    """challenger → the new version; if promoted, previous → the replaced champion and, last,
    champion → the new version. If that last call fails, champion is unchanged and previous is
    put back where it was, so the failure moves no alias but challenger. The champion is read
    again first: another registration that moved it since this gate's check (MLflow has no
    compare-and-set) makes this promotion fail rather than replace a model it was never
    compared with; what remains unguarded is the few milliseconds between that read and the
    move."""
    client.set_registered_model_alias(name, CHALLENGER, version)
    if not promoted:
        return
    aliases = _aliases(client, name)
    if aliases.get(CHAMPION) != replaced:
        raise InputError(
            f"the champion of {name} moved (v{replaced} → v{aliases.get(CHAMPION)}) while "
            f"v{version} was registered; it stays unpromoted: run `sidrec register` again"
        )
    before = aliases.get(PREVIOUS)
    if replaced is not None:
        client.set_registered_model_alias(name, PREVIOUS, replaced)
    try:
        client.set_registered_model_alias(name, CHAMPION, version)
    except Exception:
        if replaced is not None and before != replaced:
            with contextlib.suppress(Exception):  # best effort, as above
                if before is None:
                    client.delete_registered_model_alias(name, PREVIOUS)
                else:
                    client.set_registered_model_alias(name, PREVIOUS, before)
        raise


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
    """The version behind ``name@champion``; None when the model or the alias does not exist.
    Any other failure of the store (a server error, no permission) is raised, not read as
    "no champion"."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException as exc:
        if _not_found(exc):
            return None
        raise


def _not_found(exc: Exception) -> bool:
    """An MLflow answer that a model, version or alias does not exist (the codes the SQL and
    REST stores give), as opposed to a failure of the store."""
    code = getattr(exc, "error_code", None)
    return code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def holds_version(name: str, version: str, run_id: str) -> bool:
    """Whether the project's registry still has ``name`` v``version``, registered from run
    ``run_id`` (False after the store was reset, or for another store's version)."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client().get_model_version(name, version).run_id) == run_id
    except MlflowException as exc:
        if _not_found(exc):
            return False
        raise


def rejections_in_a_row(client: Any, name: str) -> int:
    """How many of ``name``'s newest versions the gate rejected since it last promoted one:
    versions newest first, counting ``sidrec.decision=rejected`` up to the first ``promoted``
    (versions without a gate decision, e.g. registered by hand, are passed over). 0 when the
    newest decision was a promotion or the model does not exist."""
    versions = client.search_model_versions(f"name = '{name}'")
    count = 0
    for version in sorted(versions, key=lambda v: int(v.version), reverse=True):
        decision = (version.tags or {}).get(TAG_DECISION)
        if decision == "promoted":
            break
        if decision == "rejected":
            count += 1
    return count


def model_name(settings: Settings) -> str:
    """The registered model's name: ``register.model_name`` or ``sidrec-<dataset>``."""
    return settings.register_.model_name or f"sidrec-{settings.project.dataset}"


def client() -> Any:
    """An ``MlflowClient`` of the project's tracking store (``MLFLOW_TRACKING_URI`` or SQLite)."""
    import mlflow

    require_server()
    mlflow.set_tracking_uri(tracking_uri())
    return mlflow.MlflowClient(tracking_uri())


def champion_label(settings: Settings) -> str:
    """``<name>@champion (v<N>)``, or an empty string without a champion (a cache-key part)."""
    name = model_name(settings)
    version = champion_version(client(), name)
    return f"{name}@champion (v{version})" if version else ""


class ChampionFiles(NamedTuple):
    """A registered recommender's artifacts, downloaded (``models/pyfunc.py`` ARTIFACTS)."""

    version: str
    model_dir: Path
    """The model folder (config.json + tokenizer)."""
    sid_map: Path
    catalog: Path
    generation: Path


def download_version(client: Any, name: str, version: str, dest: Path) -> ChampionFiles:
    """Download version ``version`` of ``name`` under ``dest`` and find its artifacts; an
    InputError naming the version when they cannot be downloaded or found."""
    import mlflow

    try:
        local = Path(
            mlflow.artifacts.download_artifacts(f"models:/{name}/{version}", dst_path=str(dest))
        )
    except Exception as exc:  # any MLflow/storage failure: the alias must not move
        raise InputError(f"cannot download {name} v{version} from the registry: {exc}") from None
    folders = sorted(
        p.parent
        for p in local.rglob("config.json")
        if (p.parent / "tokenizer_config.json").exists()
    )
    if not folders:
        raise InputError(
            f"{name} v{version} holds no model folder (config.json + tokenizer)", path=local
        )
    found = {
        n: sorted(local.rglob(n)) for n in ("sid_map.json", "catalog.parquet", "generation.json")
    }
    return ChampionFiles(
        version,
        folders[0],
        *(found[n][0] if found[n] else local / n for n in found),
    )


def download_champion(client: Any, name: str, dest: Path) -> ChampionFiles | None:
    """The champion's artifacts downloaded under ``dest``; None without a champion."""
    version = champion_version(client, name)
    return None if version is None else download_version(client, name, version, dest)


def champion_start(settings: Settings, dest: Path, *, purpose: str = "warm start") -> Path | None:
    """The champion's model folder, downloaded under ``dest`` to continue training from it
    (``purpose`` names the setting that asked, for the log); None without a champion."""
    name = model_name(settings)
    found = download_champion(client(), name, dest)
    if found is None:
        log.info("%s: no champion of %s yet; starting from a fresh model", purpose, name)
        return None
    log.info("%s: continuing from %s v%s", purpose, name, found.version)
    return found.model_dir


class Champion(NamedTuple):
    """The served champion: its MLflow pyfunc model, loaded."""

    model: Any
    """The loaded ``mlflow.pyfunc.PyFuncModel``."""
    uri: str
    version: str


def load_champion(settings: Settings) -> Champion:
    """The model behind ``models:/<name>@champion``; a clear error when there is none."""
    import mlflow

    name = model_name(settings)
    registry = client()
    version = champion_version(registry, name)
    if version is None:
        what = "has no champion" if _registered(registry, name) else "is not registered"
        raise InputError(
            f"model {name!r} {what} in the MLflow registry at {tracking_uri()}; run "
            "`sidrec pipeline` (or `sidrec register`), or set MLFLOW_TRACKING_URI to the "
            "server that holds it"
        )
    uri = f"models:/{name}@{CHAMPION}"
    log.info("loading %s (version %s)", uri, version)
    # by version: should the alias move meanwhile, the model is still the version reported
    return Champion(mlflow.pyfunc.load_model(f"models:/{name}/{version}"), uri, version)


def _registered(client: Any, name: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        return False
    return True
