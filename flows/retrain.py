"""Flow ``retrain``: the whole chain, as far as ``until``. Parameters are plain values so the
flow can be deployed and triggered with typed parameters from the Prefect UI."""

from __future__ import annotations

from typing import Literal

from prefect import flow, get_run_logger

from flows.common import run_steps
from flows.data import prepare_data
from flows.dispatch import run_training
from flows.lock import dataset_lock
from flows.sids import build_sids
from sidrec.config import Settings, literal_override, load_settings, save_run_config
from sidrec.distributed import require_one_process
from sidrec.dvc_state import record_in_dvc
from sidrec.stage import STAGES, Stage, StageResult, reaches
from sidrec.tracking import pipeline_run
from tasks.register import register_task


@flow(name="retrain")
def retrain(
    config_path: str = "params.yaml",
    overrides: list[str] | None = None,
    until: Stage = STAGES[-1],
    dataset: str | None = None,
    preset: Literal["tiny", "smollm2-135m", "hf"] | None = None,
) -> dict[str, StageResult]:
    """Load ``params.yaml`` (+ overrides), save the resolved config, run the stages: data →
    SIDs → training (inline, or on the gpu pool when ``orchestration.gpu_deployment`` is set)
    → registration behind the promotion gate. A run without overrides is then recorded in
    ``dvc.lock`` (``sidrec/dvc_state.py``); one with overrides leaves it untouched. The stages
    wait for any other retrain of the dataset to end first (``flows/lock.py``).

    Args:
        config_path: the configuration file, relative to the worker's project folder.
        overrides: section.key=value entries, as `sidrec pipeline --set` (values are YAML).
        until: the last stage to run.
        dataset: shortcut for project.dataset=<dataset>.
        preset: shortcut for model.preset=<preset>.
    """
    require_one_process("the retrain flow")
    # the shortcuts go last so they win over `overrides`, as the CLI flags win over --set
    shortcuts = {"project.dataset": dataset, "model.preset": preset}
    taken = (literal_override(k, v) for k, v in shortcuts.items() if v is not None)
    overrides = [*(overrides or []), *taken]
    settings = load_settings(config_path, overrides)
    saved = save_run_config(settings, "retrain")
    get_run_logger().info(
        "dataset %s; resolved config saved to %s", settings.project.dataset, saved
    )
    # one retrain of a dataset at a time, whichever deployment (or the CLI) started it: the
    # stages write the dataset's files and register its model (flows/lock.py); a gpu child run
    # of the training stages works under this run's hold
    dataset, timeout_s = settings.project.dataset, settings.orchestration.lock_timeout_s
    with dataset_lock(dataset, timeout_s=timeout_s):
        # one MLflow parent run; every stage's run nests under it
        with pipeline_run(dataset=dataset, params=settings.to_yaml_dict(), run_name="retrain"):
            results = _run_stages(settings, config_path, overrides, until)
        # `dvc status` / `dvc repro` then see what this run made (sidrec/dvc_state.py)
        recorded = record_in_dvc(results, config_path=config_path, overrides=overrides)
        get_run_logger().info(recorded)
    return results


def _run_stages(
    settings: Settings, config_path: str, overrides: list[str] | None, until: Stage
) -> dict[str, StageResult]:
    results = prepare_data(settings, until=until)
    if reaches(until, "embed"):
        results |= build_sids(settings, until=until)
    if reaches(until, "baselines"):
        results |= run_training(settings, config_path, overrides, until)
    if reaches(until, "register"):  # the stage itself honours register.enabled
        results |= run_steps([register_task], settings, until)
    return results
