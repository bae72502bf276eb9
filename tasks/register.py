"""Stage 9 — register: log the trained recommender as an MLflow pyfunc model, register it as a
new version of ``sidrec-<dataset>`` (alias ``challenger``) and promote it to ``champion`` only
if it beats the current champion on the gate metric (``sidrec/registry.py``). Writes
``metrics/register.json``.

The candidate is the GRPO model when that stage ran (``register.candidate: auto``), else the
SFT model; its gate metric comes from its row of ``metrics/eval.json``. Everything that can be
wrong with the inputs is checked before anything is logged.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, NamedTuple

from prefect import task

from sidrec.config import Settings
from sidrec.errors import ConfigError, InputError
from sidrec.io import atomic_write_json, read_json
from sidrec.orchestration import StageCache, publish_markdown
from sidrec.stage import StageResult

log = logging.getLogger(__name__)


class Candidate(NamedTuple):
    name: str
    """The stage that trained it: ``grpo`` or ``sft`` (its row in ``metrics/eval.json``)."""
    model_dir: Path


def model_name(settings: Settings) -> str:
    """The registered model's name: ``register.model_name`` or ``sidrec-<dataset>``."""
    return settings.register_.model_name or f"sidrec-{settings.project.dataset}"


def pick_candidate(settings: Settings) -> Candidate:
    """The model to register: ``register.candidate``, where ``auto`` means the GRPO model when
    ``grpo.enabled`` and it exists, else the SFT model."""
    from models.lm import check_model_dir

    paths = settings.paths
    choice = settings.register_.candidate
    if choice == "auto":
        grpo_ran = settings.grpo.enabled and paths.grpo_model.is_dir()
        choice = "grpo" if grpo_ran else "sft"
    model_dir = paths.grpo_model if choice == "grpo" else paths.sft_model
    if not model_dir.is_dir():
        raise InputError(
            f"no {choice} model to register; run `sidrec {choice}` first", path=model_dir
        )
    check_model_dir(model_dir)
    return Candidate(choice, model_dir)


def candidate_metrics(settings: Settings, candidate: str) -> dict[str, float]:
    """The candidate's row of ``metrics/eval.json`` as ``{"test.ndcg@10": ..., ...}``, with the
    gate metric checked present and finite."""
    from sidrec.registry import candidate_value

    path = settings.paths.metrics("eval")
    report = read_json(path, "evaluation metrics", "run `sidrec evaluate` first")
    if report.get("dataset") != settings.project.dataset:
        raise InputError(
            f"evaluation is of dataset {report.get('dataset')!r}, not "
            f"{settings.project.dataset!r}; run `sidrec evaluate` for this dataset",
            path=path,
        )
    split = settings.register_.gate_metric.split(".", 1)[0]
    row = (report.get(split) or {}).get(candidate)
    if not isinstance(row, dict):
        raise InputError(
            f"no {split!r} row for model {candidate!r} (the evaluation predates it?); "
            "run `sidrec evaluate` again",
            path=path,
        )
    metrics = {
        f"{s}.{name}": float(v)
        for s in ("valid", "test")
        for name, v in ((report.get(s) or {}).get(candidate) or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    try:
        candidate_value(metrics, settings.register_.gate_metric)
    except InputError as exc:
        raise InputError(f"{exc} (model {candidate!r})", path=path) from None
    return metrics


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
        return StageResult.from_files("register", [paths.metrics("register")], report)
    candidate = pick_candidate(settings)
    metrics = candidate_metrics(settings, candidate.name)
    report = _log_and_gate(settings, candidate, metrics)
    atomic_write_json(paths.metrics("register"), report)
    return StageResult.from_files("register", [paths.metrics("register")], report)


def _log_and_gate(
    settings: Settings, candidate: Candidate, metrics: dict[str, float]
) -> dict[str, Any]:
    import mlflow

    from models.pyfunc import GenerationSettings, log_recommender
    from sidrec.registry import register_and_gate
    from sidrec.tracking import metric_key, stage_run, tracking_uri
    from tasks.sft import load_catalog_and_map

    cfg = settings.register_
    dataset = settings.project.dataset
    items, _ = load_catalog_and_map(settings)  # checks the map covers the catalog
    if cfg.top_k > len(items):
        raise ConfigError(f"register.top_k ({cfg.top_k}) exceeds the catalog size ({len(items)})")
    generation = GenerationSettings(
        top_k=cfg.top_k,
        num_beams=cfg.num_beams,
        max_length=settings.model.max_length,
        max_history=settings.split.max_history,
    )
    name = model_name(settings)
    params = {"register": settings.section("register"), "candidate": candidate.name}
    with stage_run(dataset=dataset, stage="register", params=params) as run:
        mlflow.log_metrics({metric_key(k): v for k, v in metrics.items()})
        info = log_recommender(
            name="recommender",
            model_dir=candidate.model_dir,
            sid_map=settings.paths.sid_map,
            catalog=items,
            generation=generation,
            example_history=items["item_id"].astype(str).head(3).tolist(),
        )
        decision = register_and_gate(
            mlflow.MlflowClient(tracking_uri()),
            model_name=name,
            model_uri=info.model_uri,
            run_id=run.info.run_id,
            model_id=info.model_id,
            gate_metric=cfg.gate_metric,
            metrics=metrics,
            min_margin=cfg.min_margin,
            tags={"sidrec.dataset": dataset, "sidrec.candidate": candidate.name},
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
    }


def summary_line(report: dict[str, Any]) -> str:
    """One line for the CLI's summary table."""
    if report.get("skipped"):
        return f"skipped ({report['reason']})"
    verdict = "promoted to champion" if report["promoted"] else "not promoted"
    before = (
        f"champion v{report['champion_version']} {_number(report['champion_value'])}"
        if report["champion_version"]
        else "no champion before"
    )
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
        ("gate metric", f"`{report['gate_metric']}` (margin {report['min_margin']:g})"),
        ("candidate", _number(report["candidate_value"])),
        (
            "champion before",
            f"v{report['champion_version']}: {_number(champion)}"
            if report["champion_version"]
            else "none",
        ),
        ("reason", report["reason"]),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return (
        f"### {report['model_name']} v{report['version']}: {verdict}\n\n| | |\n|---|---|\n{table}\n"
    )


def _number(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.4f}"


@task(name="register", cache_policy=StageCache(stage="register"), persist_result=True)
def register_task(settings: Settings) -> StageResult:
    result = register(settings)
    publish_markdown(
        "register",
        settings.project.dataset,
        decision_markdown(result.metrics),
        description="Model registry: promotion gate decision",
    )
    return result
