"""sft and grpo as several processes (``accelerate launch``): sidrec/distributed.py,
tasks/shared/training.py and tasks/shared/launch.py; the slow test trains on 2 CPU processes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sidrec.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "docker" / "accelerate"


def _launched(monkeypatch: pytest.MonkeyPatch, rank: int, processes: int) -> None:
    """This process as rank ``rank`` of ``processes``, as torchrun announces it."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(processes))


def test_one_process_outside_a_launcher(monkeypatch):
    from sidrec.distributed import broadcast_from_main, gather_all, is_main_process, world_size

    for name in ("RANK", "WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert world_size() == 1 and is_main_process()
    assert broadcast_from_main({"a": 1}) == {"a": 1} and gather_all(3) == [3]


def test_a_step_is_shared_evenly_among_the_processes(monkeypatch):
    from tasks.shared.training import check_enough, per_process

    _launched(monkeypatch, 1, 4)
    assert per_process(24, "sft.batch_size") == 6
    with pytest.raises(ConfigError, match=r"grpo.prompts_per_step=6 is not a multiple of the 4"):
        per_process(6, "grpo.prompts_per_step")
    check_enough(4, 4, "training examples", "launch fewer processes")
    with pytest.raises(
        ConfigError, match=r"3 training examples, but .* at least 4 for 4 processes; launch fewer"
    ):
        check_enough(3, 4, "training examples", "launch fewer processes")


@pytest.mark.parametrize(
    ("env", "lora", "message"),
    [
        (
            {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"},
            False,
            "ZeRO-3",
        ),
        ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}, False, "FSDP version 1"),
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
            True,
            "model.lora.enabled with FSDP",
        ),
    ],
)
def test_launches_that_cannot_save_one_model_are_refused(
    project, make_settings, monkeypatch, env, lora, message
):
    from tasks.shared.training import trainer_arguments

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = make_settings(project, model={"lora": {"enabled": lora}})
    with pytest.raises(ConfigError, match=message):
        trainer_arguments(settings, "sft")


def test_a_weight_average_under_fsdp_is_refused_before_any_work(
    project, make_settings, monkeypatch
):
    from tasks.shared.training import trainer_arguments

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    settings = make_settings(project)  # sft.ema_decay 0.995 by default, grpo.ema_decay null
    with pytest.raises(ConfigError, match=r"sft.ema_decay with FSDP.*sft.ema_decay=null"):
        trainer_arguments(settings, "sft")
    assert trainer_arguments(settings, "grpo")["learning_rate"] == settings.grpo.learning_rate
    averaged = make_settings(project, grpo={"ema_decay": 0.98})
    with pytest.raises(ConfigError, match="grpo.ema_decay with FSDP"):
        trainer_arguments(averaged, "grpo")


def test_other_ranks_open_no_mlflow_run(project, monkeypatch):
    import mlflow

    from sidrec.tracking import training_run

    _launched(monkeypatch, 1, 2)
    with training_run(dataset="ranks", stage="sft", params={"sft": {"epochs": 1}}) as run:
        assert run is None and mlflow.active_run() is None
    _launched(monkeypatch, 0, 2)
    with training_run(dataset="ranks", stage="sft") as run:
        assert run is not None and mlflow.active_run() is not None


@pytest.mark.parametrize("command", [["evaluate"], ["pipeline", "--until", "split"]])
def test_only_the_training_stages_run_under_a_launcher(project, monkeypatch, command):
    from typer.testing import CliRunner

    from sidrec.cli import app

    _launched(monkeypatch, 0, 2)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 1, result.output
    assert "runs as one process" in " ".join(result.output.split())
    assert not (project / "runs").exists()


@pytest.mark.parametrize("entry", ["retrain", "train_remote", "batch_recommend"])
def test_the_deployed_flows_refuse_a_launcher_before_touching_anything(project, monkeypatch, entry):
    """A deployment's flow started under `accelerate launch` would run once per process: it
    stops first, before it writes a run config or loads the settings."""
    from flows.batch import batch_recommend
    from flows.dispatch import train_remote
    from flows.retrain import retrain
    from sidrec.errors import SidrecError

    flow = {"retrain": retrain, "train_remote": train_remote, "batch_recommend": batch_recommend}
    _launched(monkeypatch, 0, 2)
    with pytest.raises(
        SidrecError, match="runs as one process, not under accelerate launch with 2"
    ):
        flow[entry].fn(config_path="does-not-exist.yaml")
    assert not (project / "runs").exists()


def test_the_resolved_config_reloads_with_a_preset_and_overrides(project, tmp_path):
    from sidrec.config import dump_settings, load_settings

    settings = load_settings(
        project / "params.yaml", ["project.preset=quality", "sft.epochs=3", "split.max_history=9"]
    )
    assert settings.sft.epochs == 3 and settings.model.tiny.layers == 4  # override over preset
    dump_settings(settings, tmp_path / "resolved.yaml")
    again = load_settings(tmp_path / "resolved.yaml")
    # the same sections under the same preset; the preset's keys now hold the resolved values
    assert again.model_copy(update={"presets": settings.presets}) == settings
    assert again.presets["quality"]["sft.epochs"] == 3


def test_the_flow_launches_the_stage_with_its_resolved_config(project, make_settings):
    from sidrec.config import load_settings
    from tasks.shared.launch import launch_command, run_launched

    settings = make_settings(
        project,
        orchestration={"accelerate_config": str(CONFIGS / "ddp.yaml"), "num_processes": 3},
    )
    command = launch_command(settings, "grpo", Path("runs/x/params.yaml"))
    assert command[1:] == [
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / "ddp.yaml"),
        "--num_processes",
        "3",
        "-m",
        "sidrec",
        "grpo",
        "--config",
        "runs/x/params.yaml",
    ]
    missing = make_settings(project, orchestration={"accelerate_config": "no/such.yaml"})
    with pytest.raises(ConfigError, match=r"no Accelerate config file at no/such.yaml"):
        run_launched(missing, "sft")
    assert load_settings(project / "params.yaml").orchestration.accelerate_config is None


@pytest.mark.parametrize("name", ["ddp.yaml", "deepspeed_zero2.yaml", "fsdp.yaml"])
def test_accelerate_configs_are_what_accelerate_reads(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / name))
    kinds = {"ddp.yaml": "MULTI_GPU", "deepspeed_zero2.yaml": "DEEPSPEED", "fsdp.yaml": "FSDP"}
    assert config.distributed_type.value == kinds[name]
    assert config.mixed_precision == "no"  # the trainer arguments choose bf16 per GPU
    assert config.main_process_port == 0  # a free port: launches side by side never collide
    if name == "deepspeed_zero2.yaml":
        assert config.deepspeed_config["zero_stage"] == 2
    if name == "fsdp.yaml":
        assert config.fsdp_config["fsdp_version"] == 2


def test_the_gpu_deployment_trains_under_accelerate(monkeypatch):
    import yaml

    import flows.dispatch

    raw = yaml.safe_load((REPO / "prefect.yaml").read_text())
    gpu = next(d for d in raw["deployments"] if d["name"] == "train-gpu")
    assert gpu["parameters"]["accelerate_config"] == "docker/accelerate/ddp.yaml"
    seen = []
    monkeypatch.setattr(flows.dispatch, "_train_inline", lambda s, until: seen.append(s) or {})
    monkeypatch.chdir(REPO)
    flows.dispatch.train_remote.fn(accelerate_config="docker/accelerate/ddp.yaml")
    assert seen[0].orchestration.accelerate_config == Path("docker/accelerate/ddp.yaml")


# ---------------------------------------------------------------- two CPU processes

SFT = {"epochs": 1, "batch_size": 8, "eval_every": 1, "eval_users": 6, "eval_rows": 8}
GRPO = {
    "enabled": True,
    "num_generations": 4,
    "prompts_per_step": 4,
    "max_steps": 2,
    "eval_every": 2,
    "eval_users": 6,
    "log_samples_every": 2,
    "rewards": {"ranking": 1.0, "collaborative": 0.0},
}


def _stage_runs(db: Path, stage: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("sidrec-syn")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], f"tags.`sidrec.stage` = '{stage}'")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_and_grpo_train_on_two_processes(prepared, synthetic_project, monkeypatch):
    """The train-gpu deployment's path on 2 CPU processes (gloo): the flow's tasks launch
    `sidrec sft` and `sidrec grpo` with docker/accelerate/ddp.yaml; each process trains its
    own shard, the main process alone writes the model, the metrics and the MLflow run."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two processes share the cores
    settings, db, parent, sft, grpo = _launch_sft_and_grpo(
        prepared, synthetic_project, monkeypatch, "ddp.yaml", processes=2, grpo=GRPO
    )

    # each process trained on its own half of the 60 windows + 120 alignment pairs (1 epoch):
    # sft.batch_size rows a step in all, 4 from each process; the last step is topped up
    m = sft.metrics
    rows = [s["rows"] for s in m["shards"]]
    assert m["processes"] == 2 and m["steps"] == math.ceil(180 / SFT["batch_size"])
    assert rows == [m["steps"] * SFT["batch_size"] // 2] * 2 and sum(rows) < 180 + SFT["batch_size"]
    assert m["shards"][0]["first_batch"] != m["shards"][1]["first_batch"]
    g = grpo.metrics
    assert g["processes"] == 2 and g["steps"] == 2
    assert [s["rows"] for s in g["shards"]] == [4, 4]  # 2 steps x 2 of the 4 prompts a step
    assert g["shards"][0]["first_batch"] != g["shards"][1]["first_batch"]

    _written_once_and_recommends(settings, db, parent, processes=2)


def _launch_sft_and_grpo(prepared, synthetic_project, monkeypatch, config, *, processes, grpo):
    """sft, then grpo, each under ``accelerate launch`` with ``config`` on ``processes``
    processes, inside one pipeline run whose MLflow store is a file of the project's
    (the launched processes inherit it): (settings, db, parent run id, sft, grpo results)."""
    from sidrec.tracking import pipeline_run
    from tasks.grpo import grpo_result
    from tasks.sft import sft_result
    from tasks.shared.launch import run_launched

    root = prepared.paths.data_dir.parent
    db = root / "tracking" / "mlflow.db"
    db.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    settings = synthetic_project.settings(
        root,
        sft=SFT,
        grpo=grpo,
        orchestration={"accelerate_config": str(CONFIGS / config), "num_processes": processes},
    )
    with pipeline_run(dataset="syn", params={}) as parent:
        sft = sft_result(settings, run_launched(settings, "sft"))
        grpo_done = grpo_result(settings, run_launched(settings, "grpo"))
    return settings, db, parent, sft, grpo_done


def _written_once_and_recommends(settings, db: Path, parent: str, *, processes: int) -> None:
    """One MLflow run per stage (under the pipeline's), one saved run config each, metrics that
    count the processes, no staging folder left; the GRPO model loads and recommends."""
    from tasks.shared.inputs import load_catalog_and_map, load_recommender

    root = settings.paths.data_dir.parent
    for stage in ("sft", "grpo"):
        (run,) = _stage_runs(db, stage)
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent
        assert "valid/ndcg_at_10" in run.data.metrics
        assert len(list((root / "runs").glob(f"*-{stage}/params.yaml"))) == 1
        assert json.loads(settings.paths.metrics(stage).read_text())["processes"] == processes
    assert not list(settings.paths.grpo_dir.glob(".*")) and not list(
        settings.paths.sft_dir.glob(".*")
    )
    items, sid_map = load_catalog_and_map(settings)
    recommender = load_recommender(
        settings, settings.paths.grpo_model, sid_map, items["item_id"].tolist(), missing_hint=""
    )
    ranking = recommender.rank([["i3", "i4", "i5"]], 5)
    assert len(ranking.items[0]) == 5 and all(0 <= i < len(items) for i in ranking.items[0])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", ["ddp.yaml", "deepspeed_zero2.yaml", "fsdp.yaml"])
def test_sft_and_grpo_under_each_accelerate_config_on_the_gpus(
    config, prepared, synthetic_project, monkeypatch
):
    """The gpu worker's launches (docs/operations.md, Multi-GPU training): sft and grpo under
    each Accelerate config, one process per visible GPU. Skipped without CUDA; run it where a
    GPU is lent (docs/operations.md, "The GPU checks")."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if config.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    gpus = torch.cuda.device_count()
    settings, db, parent, sft, grpo = _launch_sft_and_grpo(
        prepared,
        synthetic_project,
        monkeypatch,
        config,
        processes=gpus,
        grpo={**GRPO, "prompts_per_step": 4 * gpus},
    )
    assert sft.metrics["processes"] == gpus and grpo.metrics["processes"] == gpus
    assert grpo.metrics["steps"] == GRPO["max_steps"]
    _written_once_and_recommends(settings, db, parent, processes=gpus)


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_more_processes_than_examples_stop_before_anything_is_written(
    stage, trained, synthetic_project, monkeypatch
):
    """Rank 0 of a launch with more processes than the stage has examples (sft) or prompts per
    step (grpo): a ConfigError that names the remedy, before a model folder, a metrics file or
    an MLflow run exists."""
    import importlib

    root = trained.paths.data_dir.parent
    db = root / "tracking" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    settings = synthetic_project.settings(root, sft=SFT, grpo={**GRPO, "prompts_per_step": 1024})
    target = settings.paths.sft_model if stage == "sft" else settings.paths.grpo_model
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    model_files = {p: p.read_bytes() for p in settings.paths.sft_model.rglob("*") if p.is_file()}
    _launched(monkeypatch, 0, 1024 if stage == "sft" else 1)
    remedy = "launch fewer processes" if stage == "sft" else "lower grpo.prompts_per_step"
    with pytest.raises(ConfigError, match=f"but a training step needs at least 1024.*{remedy}"):
        getattr(importlib.import_module(f"tasks.{stage}"), stage)(settings)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert {p: p.read_bytes() for p in settings.paths.sft_model.rglob("*") if p.is_file()} == (
        model_files
    )
    assert (stage == "sft") == target.exists()  # the trained SFT model is the fixture's
    assert not db.exists()  # no MLflow run was opened
