"""Stage 9 — register: log the trained recommender as an MLflow pyfunc model, register it as a
new version of ``sidrec-<dataset>`` (alias ``challenger``) and promote it to ``champion`` only
if it is better than the current champion beyond the noise (``sidrec/registry.py``). Writes
``metrics/register.json``.

The gate decides on the **gate half** of the validation users (``register.gate_metric``,
``valid.*`` only): the candidate's per-user scores come from ``metrics/eval_users.parquet``
(refused when ``metrics/eval.json`` was computed from another model folder, split or SID
map), and the current champion's registered weights and SID map are loaded into today's
recommender code and re-scored on the same users. Under ``register.gate_best_baseline`` the
candidate is also compared, user by user on the same users, with evaluate's best baseline
(``best_baseline`` of ``metrics/eval.json``): a candidate whose paired interval against it
lies entirely below 0 is registered but never promoted. Everything that can fail — inputs,
fingerprints, the champion's files, the re-scoring — is checked before anything is logged.
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from prefect import task

from sidrec.config import Settings
from sidrec.errors import ConfigError, InputError
from sidrec.io import atomic_write_json, read_json, read_table
from sidrec.orchestration import StageCache, emit_gate_event, publish_markdown
from sidrec.protocol import fingerprint, seen_items, validation_half
from sidrec.registry import ChampionFiles, Comparison, model_name
from sidrec.schemas import SPLIT
from sidrec.stage import StageResult

log = logging.getLogger(__name__)


class BaselineCheck(NamedTuple):
    """The candidate against evaluate's best baseline on the gate users (the gate metric)."""

    name: str
    """The baseline (``best_baseline`` of ``metrics/eval.json``)."""
    value: float
    """Its mean gate metric on the gate users."""
    low: float
    high: float
    """The paired interval of (candidate − baseline) at ``register.confidence``."""
    refuses: bool
    """The interval lies entirely below 0 and ``register.gate_best_baseline`` is on."""

    def reason(self, metric: str, confidence: float, users: int) -> str:
        return (
            f"{metric} trails the best baseline {self.name} ({self.value:.4g}): paired "
            f"{confidence:.0%} interval of candidate − {self.name} [{self.low:+.4g}, "
            f"{self.high:+.4g}] over {users} gate users lies below 0 "
            "(register.gate_best_baseline)"
        )


class Judged(NamedTuple):
    """What the gate decides on, computed before anything is logged."""

    comparison: Comparison
    champion_before: str | None
    evaluation: dict[str, Any]
    """``metrics/eval.json``, checked against today's files."""
    baseline: BaselineCheck | None
    """None where evaluate names no best baseline and the check is off."""


class Candidate(NamedTuple):
    name: str
    """The stage that trained it: ``grpo`` or ``sft`` (its row in ``metrics/eval.json``)."""
    model_dir: Path


def pick_candidate(settings: Settings) -> Candidate:
    """The model to register: ``register.candidate``, where ``auto`` means the SID model
    evaluate picked (``best_generative`` of ``metrics/eval.json``): the GRPO model only where
    it scored above its SFT start on the validation selection users."""
    from models.lm import check_model_dir

    paths = settings.paths
    choice = settings.register_.candidate
    if choice == "auto":
        path = paths.metrics("eval")
        report = read_json(path, "evaluation metrics", "run `sidrec evaluate` first")
        choice = report.get("best_generative")
        if choice not in ("sft", "grpo"):
            raise InputError(
                f"the evaluation names no SID model to register (best_generative: {choice!r}); "
                "re-run `sidrec evaluate`, or set register.candidate to sft or grpo",
                path=path,
            )
    model_dir = paths.grpo_model if choice == "grpo" else paths.sft_model
    if not model_dir.is_dir():
        raise InputError(
            f"no {choice} model to register; run `sidrec {choice}` first", path=model_dir
        )
    check_model_dir(model_dir)
    return Candidate(choice, model_dir)


def checked_report(settings: Settings, candidate: Candidate) -> dict[str, Any]:
    """``metrics/eval.json``, refused unless it was computed from today's candidate folder,
    split and SID map (its fingerprints), and under ``register.gate_best_baseline`` today's
    baselines (SASRec, EASE's choice), for this dataset."""
    paths = settings.paths
    path = paths.metrics("eval")
    report = read_json(path, "evaluation metrics", "run `sidrec evaluate` first")
    if report.get("dataset") != settings.project.dataset:
        raise InputError(
            f"evaluation is of dataset {report.get('dataset')!r}, not "
            f"{settings.project.dataset!r}; run `sidrec evaluate` for this dataset",
            path=path,
        )
    recorded = (report.get("protocol") or {}).get("fingerprints") or {}
    today = {
        f"{candidate.name}_model": ([candidate.model_dir], f"the {candidate.name} model folder"),
        "split": ([paths.split(s) for s in ("train", "valid", "test")], "the split"),
        "sid_map": ([paths.sid_map], "the SID map"),
    }
    if settings.register_.gate_best_baseline:  # the best baseline's scores are compared too
        today["sasrec"] = ([paths.sasrec_model], "SASRec baseline")
        today["ease"] = ([paths.ease_choice], "EASE choice of the baselines stage")
    for key, (files, what) in today.items():
        if recorded.get(key) != fingerprint(files):
            raise InputError(
                f"the evaluation was not computed from today's {what} (fingerprint "
                f"{recorded.get(key)!r} vs {fingerprint(files)!r}); re-run `sidrec evaluate` "
                "before `sidrec register`",
                path=path,
            )
    return report


def candidate_scores(settings: Settings, candidate: str, gate: pd.DataFrame) -> np.ndarray:
    """A model's per-user gate metric on the gate users (evaluate's scores of the candidate,
    or of a baseline), in ``gate``'s row order."""
    metric = settings.register_.gate_metric.split(".", 1)[1]
    path = settings.paths.eval_users
    users = pd.read_parquet(path) if path.exists() else None
    if users is None or metric not in users.columns:
        raise InputError(
            f"no per-user {metric!r} scores (evaluate.ks must include its K); "
            "run `sidrec evaluate` again",
            path=path,
        )
    rows = users[(users["split"] == "valid") & (users["model"] == candidate)]
    if rows["user_id"].tolist() != gate["user_id"].astype(str).tolist():
        raise InputError(
            f"the per-user scores of {candidate!r} are not of today's gate users; "
            "run `sidrec evaluate` again",
            path=path,
        )
    return rows[metric].to_numpy(dtype=np.float64)


def gate_rows(settings: Settings) -> tuple[pd.DataFrame, list[list[str]] | None]:
    """The gate users' valid rows and, under ``evaluate.exclude_seen``, their seen items
    (the rows and rule evaluate scored the candidate on)."""
    paths = settings.paths
    train = read_table(paths.split("train"), SPLIT, "train split")
    valid = read_table(paths.split("valid"), SPLIT, "valid split")
    gate = validation_half(valid, "gate")
    if settings.evaluate.max_users:
        gate = gate.head(settings.evaluate.max_users)
    return gate, seen_items(train, gate) if settings.evaluate.exclude_seen else None


def _popularity(settings: Settings, items: pd.DataFrame) -> np.ndarray:
    """Training interactions per catalog item: the served model's fallback ranking for
    histories it knows nothing of."""
    from models.baselines.popularity import Popularity

    model = Popularity(item_ids=items["item_id"].astype(str).tolist())
    return model.fit(read_table(settings.paths.split("train"), SPLIT, "train split")).counts


def rescore(
    settings: Settings, champion: ChampionFiles, gate: pd.DataFrame, seen: list[list[str]] | None
) -> tuple[np.ndarray, int, int]:
    """The champion's per-user gate metric on ``gate`` with today's recommender code: history
    items it does not know are dropped, targets it does not know are misses, and a history
    left with no known item gets the most popular items, as the served champion answers it.
    Returns (scores, dropped history items, unknown targets)."""
    from models.metrics import per_row_metrics
    from models.pyfunc import Recommender

    metric = settings.register_.gate_metric.split(".", 1)[1]
    k = int(metric.split("@")[1])
    try:  # the champion's weights and SID map behind today's recommender code
        served = Recommender.from_files(
            model_dir=champion.model_dir,
            sid_map=champion.sid_map,
            catalog=champion.catalog,
            generation=champion.generation,
            num_beams=settings.evaluate.num_beams,
            batch_size=settings.evaluate.batch_size,
        )
        recommender = served.ranker
    except (OSError, ValueError, KeyError, TypeError, InputError) as exc:
        raise InputError(
            f"the champion v{champion.version} cannot be loaded for re-scoring: {exc}; "
            "no alias was moved (fix the registered version or move the alias by hand)"
        ) from None
    known = set(recommender.item_ids)
    histories = [[i for i in h if i in known] for h in gate["history"]]
    dropped = sum(len(h) for h in gate["history"]) - sum(len(h) for h in histories)
    targets = np.array([recommender.index.get(t, -1) for t in gate["target"]])
    width = min(k, recommender.n_items)
    ranked = [r for r, h in enumerate(histories) if h]
    items = np.full((len(gate), width), -1, dtype=np.int64)
    if ranked:
        items[ranked] = recommender.rank(
            [histories[r] for r in ranked],
            width,
            exclude=None if seen is None else [seen[r] for r in ranked],
            progress=True,
        ).items
    empty = [r for r, h in enumerate(histories) if not h]
    if empty:  # the most popular items, less the user's seen ones, as evaluate excludes them
        order = [i for i in served.popular(1, recommender.n_items)[0][0].tolist() if i >= 0]
        for r in empty:
            banned = {recommender.index[i] for i in (seen[r] if seen else []) if i in known}
            row = [i for i in order if i not in banned][:width]
            items[r, : len(row)] = row
    scores = np.zeros(len(gate))
    hit = targets >= 0
    if hit.any():
        topk = items[hit]
        if topk.shape[1] < k:  # a catalog smaller than K: pad with misses
            topk = np.pad(topk, ((0, 0), (0, k - topk.shape[1])), constant_values=-1)
        scores[hit] = per_row_metrics(topk, targets[hit], [k])[metric]
    return scores, dropped, int((~hit).sum())


def against_best_baseline(
    settings: Settings, report: dict[str, Any], gate: pd.DataFrame, ours: np.ndarray
) -> BaselineCheck | None:
    """The candidate's gate scores ``ours`` against evaluate's best baseline on the same gate
    users; refused inputs where the check is on and the evaluation names no best baseline."""
    from models.stats import paired_bootstrap_interval

    cfg = settings.register_
    name = report.get("best_baseline")
    if not isinstance(name, str):
        if not cfg.gate_best_baseline:
            return None
        raise InputError(
            f"the evaluation names no best baseline (best_baseline: {name!r}), which "
            "register.gate_best_baseline compares the candidate with; re-run `sidrec evaluate`, "
            "or set register.gate_best_baseline false",
            path=settings.paths.metrics("eval"),
        )
    theirs = candidate_scores(settings, name, gate)
    interval = paired_bootstrap_interval(
        ours,
        theirs,
        groups=gate["user_id"].astype(str).to_numpy(),
        confidence=cfg.confidence,
        n_resamples=settings.evaluate.bootstrap_resamples,
        seed=settings.project.seed,
    )
    return BaselineCheck(
        name=name,
        value=float(theirs.mean()),
        low=float(interval.low),
        high=float(interval.high),
        refuses=cfg.gate_best_baseline and interval.high < 0,
    )


def compare(settings: Settings, candidate: Candidate) -> Judged:
    """The candidate against the current champion and against the best baseline on the gate
    users (nothing logged yet)."""
    from models.stats import paired_bootstrap_interval
    from sidrec.registry import champion_version, client, download_version

    cfg = settings.register_
    report = checked_report(settings, candidate)
    gate, seen = gate_rows(settings)
    ours = candidate_scores(settings, candidate.name, gate)
    baseline = against_best_baseline(settings, report, gate, ours)
    before = champion_version(client(), model_name(settings))
    if before is None:
        comparison = Comparison(
            metric=cfg.gate_metric,
            challenger=float(ours.mean()),
            champion=None,
            low=None,
            high=None,
            confidence=cfg.confidence,
            users=int(gate["user_id"].nunique()),
        )
        return Judged(comparison, None, report, baseline)
    with tempfile.TemporaryDirectory(prefix="sidrec-champion-") as tmp:
        files = download_version(client(), model_name(settings), before, Path(tmp))
        theirs, dropped, unknown = rescore(settings, files, gate, seen)
    interval = paired_bootstrap_interval(
        ours,
        theirs,
        groups=gate["user_id"].astype(str).to_numpy(),  # a user's several rows drawn together
        confidence=cfg.confidence,
        n_resamples=settings.evaluate.bootstrap_resamples,
        seed=settings.project.seed,
    )
    comparison = Comparison(
        metric=cfg.gate_metric,
        challenger=float(ours.mean()),
        champion=float(theirs.mean()),
        low=float(interval.low),
        high=float(interval.high),
        confidence=cfg.confidence,
        users=int(gate["user_id"].nunique()),
        dropped_history_items=dropped,
        unknown_targets=unknown,
    )
    return Judged(comparison, before, report, baseline)


def register(settings: Settings) -> StageResult:
    """Log, register and gate the candidate; ``register.enabled: false`` logs nothing."""
    cfg = settings.register_
    paths = settings.paths
    if not cfg.enabled:
        report: dict[str, Any] = {
            "dataset": settings.project.dataset,
            "skipped": True,
            "reason": "register.enabled is false",
        }
        atomic_write_json(paths.metrics("register"), report)
        log.info("register: skipped (register.enabled is false)")
        return StageResult.from_files(
            "register", [paths.metrics("register")], report, summary_line(report)
        )
    candidate = pick_candidate(settings)
    report = _log_and_gate(settings, candidate, compare(settings, candidate))
    atomic_write_json(paths.metrics("register"), report)
    return StageResult.from_files(
        "register", [paths.metrics("register")], report, summary_line(report)
    )


def _log_and_gate(settings: Settings, candidate: Candidate, judged: Judged) -> dict[str, Any]:
    import mlflow

    from models.pyfunc import GenerationSettings, log_recommender
    from sidrec.registry import client, register_and_gate, rejections_in_a_row
    from sidrec.tracking import metric_key, stage_run
    from tasks.shared.inputs import load_catalog_and_map

    cfg = settings.register_
    comparison, before, evaluation, baseline = judged
    dataset = settings.project.dataset
    items, _ = load_catalog_and_map(settings)  # checks the map covers the catalog
    if cfg.top_k > len(items):
        raise ConfigError(f"register.top_k ({cfg.top_k}) exceeds the catalog size ({len(items)})")
    generation = GenerationSettings(
        top_k=cfg.top_k,
        num_beams=settings.evaluate.num_beams,
        max_length=settings.model.max_length,
        max_history=settings.split.max_history,
        batch_size=settings.evaluate.batch_size,
        exclude_history=settings.evaluate.exclude_seen,
    )
    metrics = {
        f"{s}.{name}": float(v)
        for s in ("valid", "test")
        for name, v in ((evaluation.get(s) or {}).get(candidate.name) or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    fingerprints = evaluation["protocol"]["fingerprints"]
    tags = {
        "sidrec.dataset": dataset,
        "sidrec.candidate": candidate.name,
        **{f"sidrec.fingerprint.{k}": str(v) for k, v in fingerprints.items()},
        **_baseline_tags(baseline),
    }
    name = model_name(settings)
    veto = None  # a candidate below the best baseline is registered, never promoted
    if baseline is not None and baseline.refuses:
        veto = baseline.reason(comparison.metric, comparison.confidence, comparison.users)
    params = {"register": settings.section("register"), "candidate": candidate.name}
    with stage_run(dataset=dataset, stage="register", params=params) as run:
        mlflow.log_metrics({metric_key(k): v for k, v in metrics.items()})
        info = log_recommender(
            name="recommender",
            model_dir=candidate.model_dir,
            sid_map=settings.paths.sid_map,
            catalog=items.assign(popularity=_popularity(settings, items)),
            generation=generation,
            example_history=items["item_id"].astype(str).head(3).tolist(),
        )
        decision = register_and_gate(
            client(),
            model_name=name,
            model_uri=info.model_uri,
            comparison=comparison,
            champion_before=before,
            metrics=metrics,
            min_margin=cfg.min_margin,
            run_id=run.info.run_id,
            model_id=info.model_id,
            tags=tags,
            veto=veto,
        )
        mlflow.set_tags(
            {
                "sidrec.registered_version": decision.version,
                "sidrec.decision": "promoted" if decision.promoted else "rejected",
            }
        )
    return {
        "dataset": dataset,
        "skipped": False,
        "candidate": candidate.name,
        "model_dir": str(candidate.model_dir),
        "run_id": run.info.run_id,
        "model_uri": info.model_uri,
        **decision._asdict(),
        "aliases": list(decision.aliases),
        "dropped_history_items": comparison.dropped_history_items,
        "unknown_targets": comparison.unknown_targets,
        "fingerprints": fingerprints,
        "gate_best_baseline": cfg.gate_best_baseline,
        "best_baseline": None if baseline is None else baseline._asdict(),
        # from the registry's decision tags: what the gate-rejections automation watches
        "rejections_in_a_row": rejections_in_a_row(client(), name),
    }


def _baseline_tags(baseline: BaselineCheck | None) -> dict[str, str]:
    """Version tags of the check against the best baseline (none where it did not run)."""
    if baseline is None:
        return {}
    return {
        "sidrec.best_baseline": baseline.name,
        "sidrec.best_baseline_value": str(baseline.value),
        "sidrec.best_baseline_diff_low": str(baseline.low),
        "sidrec.best_baseline_diff_high": str(baseline.high),
    }


def summary_line(report: dict[str, Any]) -> str:
    """One line for the CLI's summary table."""
    if report.get("skipped"):
        return f"skipped ({report['reason']})"
    verdict = "promoted to champion" if report["promoted"] else "not promoted"
    baseline = report.get("best_baseline")
    if baseline and baseline["refuses"]:
        verdict += f" (below the best baseline {baseline['name']})"
    if report.get("rejections_in_a_row", 0) > 1:
        verdict += f" ({report['rejections_in_a_row']} in a row)"
    if report["champion_version"]:
        before = (
            f"champion v{report['champion_version']} {_number(report['champion_value'])}, "
            f"diff [{_number(report['diff_low'], True)}, {_number(report['diff_high'], True)}]"
        )
    else:
        before = "no champion before"
    return (
        f"{report['model_name']} v{report['version']} ({report['candidate']}) · {verdict} · "
        f"{report['gate_metric']} {_number(report['candidate_value'])} vs {before}"
    )


def decision_markdown(report: dict[str, Any]) -> str:
    """The decision as a short markdown report (Prefect artifact)."""
    if report.get("skipped"):
        return f"**register**: skipped ({report['reason']})."
    verdict = "promoted to **champion**" if report["promoted"] else "**not promoted**"
    champion = report["champion_value"]
    rows = [
        ("model", f"`{report['model_name']}` v{report['version']} ({report['candidate']})"),
        ("aliases", ", ".join(report["aliases"]) or "-"),
        (
            "gate metric",
            f"`{report['gate_metric']}` on {report['gate_users']} gate users "
            f"(margin {report['min_margin']:g})",
        ),
        ("candidate", _number(report["candidate_value"])),
        (
            "champion before (re-scored today)",
            f"v{report['champion_version']}: {_number(champion)}"
            if report["champion_version"]
            else "none",
        ),
        (
            f"candidate − champion, paired {report['confidence']:.0%} interval",
            f"[{_number(report['diff_low'], True)}, {_number(report['diff_high'], True)}]",
        ),
        (
            "champion: dropped history items / unknown targets",
            f"{report['dropped_history_items']} / {report['unknown_targets']}",
        ),
        _baseline_row(report),
        ("data", ", ".join(f"{k} `{v}`" for k, v in report["fingerprints"].items())),
        ("reason", report["reason"]),
        ("gate rejections in a row", str(report.get("rejections_in_a_row", "-"))),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return (
        f"### {report['model_name']} v{report['version']}: {verdict}\n\n| | |\n|---|---|\n{table}\n"
    )


def _baseline_row(report: dict[str, Any]) -> tuple[str, str]:
    """The decision table's row of the check against the best baseline."""
    baseline = report.get("best_baseline")
    if not baseline:
        return ("candidate − best baseline", "not checked")
    if baseline["refuses"]:
        effect = "below 0: refuses promotion"
    elif baseline["high"] < 0:
        effect = "below 0 (register.gate_best_baseline is off)"
    else:
        effect = "not below 0"
    return (
        f"candidate − best baseline ({baseline['name']} {_number(baseline['value'])}), "
        f"paired {report['confidence']:.0%} interval",
        f"[{_number(baseline['low'], True)}, {_number(baseline['high'], True)}]: {effect}",
    )


def _number(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


@task(name="register", cache_policy=StageCache(stage="register"), persist_result=True)
def register_task(settings: Settings) -> StageResult:
    result = register(settings)
    publish_markdown(
        "register",
        settings.project.dataset,
        decision_markdown(result.metrics),
        description="Model registry: promotion gate decision",
    )
    emit_gate_event(result.metrics)  # what the automations of flows/automations.py watch
    return result
