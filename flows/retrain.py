"""Flow ``retrain``: the whole chain, as far as ``until``. Parameters are plain values so the
flow can be deployed and triggered with typed parameters from the Prefect UI."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.common import run_stage, save_run_config
from flows.data import prepare_data
from flows.dispatch import run_training
from flows.sids import build_sids
from sidrec.config import Settings, load_settings
from sidrec.stage import STAGES, Stage, StageResult
from sidrec.tracking import pipeline_run


@flow(name="retrain")
def retrain(
    config_path: str = "params.yaml",
    overrides: list[str] | None = None,
    until: Stage = STAGES[-1],
) -> dict[str, StageResult]:
    """Load ``params.yaml`` (+ ``section.key=value`` overrides), save the resolved config, run
    the stages: data → SIDs → training (inline, or on the gpu pool when
    ``orchestration.gpu_deployment`` is set) → registration behind the promotion gate."""
    settings = load_settings(config_path, overrides or [])
    saved = save_run_config(settings, "retrain")
    get_run_logger().info(
        "dataset %s; resolved config saved to %s", settings.project.dataset, saved
    )
    # one MLflow parent run; every stage's run nests under it
    with pipeline_run(
        dataset=settings.project.dataset, params=settings.to_yaml_dict(), run_name="retrain"
    ):
        return _run_stages(settings, config_path, overrides, until)


def _run_stages(
    settings: Settings, config_path: str, overrides: list[str] | None, until: Stage
) -> dict[str, StageResult]:
    results = prepare_data(settings, until=_clip(until, "split"))
    if _reaches(until, "embed"):
        results |= build_sids(settings, until=_clip(until, "sids"))
    if _reaches(until, "sft"):
        results |= run_training(settings, config_path, overrides, _clip(until, "evaluate"))
    if _reaches(until, "register") and settings.register_.enabled:
        from tasks.register import register_task

        results["register"] = run_stage(register_task, settings)
    return results


def _reaches(until: Stage, stage: Stage) -> bool:
    return STAGES.index(until) >= STAGES.index(stage)


def _clip(until: Stage, last: Stage) -> Stage:
    """``until``, or ``last`` when ``until`` lies beyond this flow's stages."""
    return until if STAGES.index(until) <= STAGES.index(last) else last
