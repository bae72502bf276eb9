"""The platform against real servers: ``mlflow server`` and ``prefect server start`` backed by
the local PostgreSQL, process workers on the ``cpu`` and ``gpu`` pools, the deployments of
``prefect.yaml``, and one ``retrain-manual`` run triggered through the API on a tiny dataset
(training goes through the ``train-gpu`` child deployment). MLflow keeps its artifacts in an S3
bucket, as in the compose stack, on moto's S3 server standing in for MinIO (``s3_store``).

Needs PostgreSQL on 127.0.0.1:5432 with trust auth for ``postgres`` (as on CI); the test makes
its own databases and drops them, runs everything on free loopback ports, and leaves nothing
behind but what pytest's ``tmp_path`` holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.retrain import tiny_project_overrides
from flows.automations import RETRAIN_FAILED
from sidrec.orchestration import MODEL_PROMOTED, REJECTIONS_LABEL

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_ADMIN = {"host": "127.0.0.1", "port": 5432, "user": "postgres", "dbname": "postgres"}
DATASET = "itest"
RUN_TIMEOUT_S = 1200

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S + 300)]


# ---------------------------------------------------------------- databases and commands


@pytest.fixture
def databases() -> Iterator[dict[str, str]]:
    """Two fresh PostgreSQL databases (Prefect, MLflow), dropped afterwards."""
    # a dependency, not a skip reason: SQLAlchemy 2.1 (mlflow's backend store) reads
    # postgresql:// URIs with psycopg 3
    import psycopg

    try:
        # autocommit: CREATE/DROP DATABASE cannot run inside a transaction
        admin = psycopg.connect(**PG_ADMIN, connect_timeout=5, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432 for user postgres: {exc}")
    suffix = uuid.uuid4().hex[:8]
    names = {"prefect": f"sidrec_it_prefect_{suffix}", "mlflow": f"sidrec_it_mlflow_{suffix}"}
    with admin.cursor() as cur:
        for name in names.values():
            cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield names
    finally:
        with admin.cursor() as cur:
            for name in names.values():
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def wait_for_event(client: Any, name: str, timeout: float = 60) -> Any:
    """The newest event called ``name`` the server has stored (it persists them in batches)."""
    from prefect.events.filters import EventFilter, EventNameFilter

    deadline = time.monotonic() + timeout
    while True:
        # limit: the client's default (100) is above what the server accepts (50)
        page = client.read_events(filter=EventFilter(event=EventNameFilter(name=[name])), limit=10)
        if page.events or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert page.events, f"no {name} event stored within {timeout} s"
    return page.events[0]


# ---------------------------------------------------------------- the tiny project


def write_project(root: Path) -> tuple[Path, list[str]]:
    """A project folder: the repo's params.yaml, the benchmark's tiny generated dataset, and
    overrides that keep every output under ``root`` and send training to the train-gpu
    deployment (they reach the flow run as its ``overrides`` parameter, as typed in the UI)."""
    root.mkdir(parents=True)
    config = root / "params.yaml"
    shutil.copy(REPO / "params.yaml", config)
    overrides = [
        *tiny_project_overrides(root),
        f"project.dataset={DATASET}",
        *(f"project.{d}_dir={root / d}" for d in ("data", "metrics", "artifacts", "runs")),
        f"embed.cache_dir={root / 'cache'}",
        "orchestration.gpu_deployment=train-remote/train-gpu",
        "orchestration.gpu_timeout_s=900",
        # a model trained in seconds may trail the baselines, which the gate would refuse; the
        # promotion event is what this test follows (tests/tasks/test_register.py: the check)
        "register.gate_best_baseline=false",
    ]
    return config, overrides


# ---------------------------------------------------------------- the test


def mlflow_artifact_store(endpoint: str, bucket: str) -> tuple[list[str], dict[str, str]]:
    """The compose stack's MLflow artifact settings with MinIO's address and bucket replaced:
    the server's ``--serve-artifacts --artifacts-destination=s3://…`` arguments and its
    environment (MLFLOW_S3_ENDPOINT_URL; the keys come with the store)."""
    import yaml

    service = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["mlflow"]
    args = [
        arg.replace("${MLFLOW_BUCKET:-mlflow}", bucket)
        for arg in service["command"]
        if arg == "--serve-artifacts" or arg.startswith("--artifacts-destination=")
    ]
    assert len(args) == 2 and f"=s3://{bucket}/" in args[1], service["command"]
    minio = service["environment"]["MLFLOW_S3_ENDPOINT_URL"]
    assert minio == "http://minio:9000", minio
    return args, {"MLFLOW_S3_ENDPOINT_URL": endpoint}


def test_retrain_manual_deployment_on_real_servers(
    tmp_path: Path,
    databases: dict[str, str],
    processes,
    free_port,
    s3_store,
) -> None:
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from sidrec.config import load_settings

    config, overrides = write_project(tmp_path / "project")
    load_settings(config, overrides)  # a typo in the overrides fails here, not in the worker
    prefect_port, mlflow_port = free_port(), free_port()
    api = f"http://127.0.0.1:{prefect_port}/api"
    tracking = f"http://127.0.0.1:{mlflow_port}"
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "MLFLOW_TRACKING_URI": tracking,
        "SIDREC_PROJECT_DIR": str(REPO),  # where prefect.yaml's pull step moves flow runs
        "GX_ANALYTICS_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
    }
    pg = "postgres@127.0.0.1:5432"
    prefect_db = f"postgresql+asyncpg://{pg}/{databases['prefect']}"
    processes.start(
        "prefect-server",
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
        {**env, "PREFECT_API_DATABASE_CONNECTION_URL": prefect_db},
        tmp_path,
    )  # fmt: skip
    # artifacts as in the stack: the server alone talks to the object store (the S3 API on
    # loopback standing in for MinIO); the workers and this test upload and download through it
    mlflow_bucket = s3_store.buckets["MLFLOW_BUCKET"]
    artifact_args, artifact_env = mlflow_artifact_store(s3_store.endpoint, mlflow_bucket)
    processes.start(
        "mlflow-server",
        [
            str(BIN / "mlflow"), "server",
            "--backend-store-uri", f"postgresql://{pg}/{databases['mlflow']}",
            *artifact_args,
            "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
        ],
        {**env, **s3_store.env, **artifact_env},
        tmp_path,
    )  # fmt: skip
    processes.wait_http("prefect-server", f"{api}/health")
    processes.wait_http("mlflow-server", f"{tracking}/health")

    prefect = str(BIN / "prefect")
    for pool in ("cpu", "gpu"):
        run_cli([prefect, "work-pool", "create", pool, "--type", "process"], env, tmp_path)
        processes.start(
            f"worker-{pool}",
            [prefect, "worker", "start", "--pool", pool, "--type", "process"],
            env,
            tmp_path,
            worker=True,
        )
    prefect_file = REPO / "prefect.yaml"
    before = prefect_file.read_text()
    run_cli(
        [prefect, "deploy", "--no-prompt", "--prefect-file", str(prefect_file),
         "--name", "retrain-manual", "--name", "train-gpu"],
        env,
        REPO,
    )  # fmt: skip
    assert prefect_file.read_text() == before, "prefect deploy must not rewrite prefect.yaml"
    # the alerts (flows/automations.py), created on this server; the server validates them
    created = run_cli(
        [str(BIN / "sidrec"), "automations", "--deployment", "retrain-manual"], env, tmp_path
    )
    assert created.count("created") == 2, created

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("retrain/retrain-manual")
        assert deployment.work_pool_name == "cpu"
        flow_run = client.create_flow_run_from_deployment(
            deployment.id,
            parameters={"config_path": str(config), "overrides": overrides, "until": "register"},
        )
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            flow_run = client.read_flow_run(flow_run.id)
            if flow_run.state is not None and flow_run.state.is_final():
                break
            time.sleep(3)
        state = flow_run.state
        assert state is not None and state.is_completed(), (
            f"retrain-manual run ended {state.name if state else 'nowhere'}: "
            f"{state.message if state else ''}\n{processes.tails()}"
        )
        # the register task told the server its gate decision, which the automation watches
        promoted = wait_for_event(client, MODEL_PROMOTED)
        assert promoted.resource.id == f"sidrec.model.sidrec-{DATASET}"
        assert promoted.resource[REJECTIONS_LABEL] == "0"
        (failed_alert,) = client.read_automations_by_name(RETRAIN_FAILED)
        assert failed_alert.trigger.match_related["prefect.resource.name"] == ["retrain-manual"]
        train_gpu = client.read_deployment_by_name("train-remote/train-gpu")
        children = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[train_gpu.id])),
            limit=10,
        )
    assert [(run.state_name, run.parent_task_run_id is not None) for run in children] == [
        ("Completed", True)
    ], "training did not run as one child run of the train-gpu deployment"

    mlflow_client = MlflowClient(tracking_uri=tracking)
    name = f"sidrec-{DATASET}"
    versions = mlflow_client.search_model_versions(f"name='{name}'")
    assert len(versions) == 1, f"registered versions of {name}: {versions}"
    champion = mlflow_client.get_model_version_by_alias(name, "champion")
    assert champion.version == versions[0].version
    assert (tmp_path / "project" / "metrics" / "register.json").exists()
    # the champion's files are in the bucket, and come back through the server byte for byte
    import mlflow

    stored = [key for key in s3_store.keys(mlflow_bucket) if key.endswith("/MLmodel")]
    assert stored and all(key.startswith("artifacts/") for key in stored), stored
    # the champion's files by their location on this server, named outright: `models:/` would
    # resolve in MLflow's process-wide registry, whatever the process last set it to
    location = mlflow_client.get_model_version_download_uri(name, champion.version)
    local = Path(
        mlflow.artifacts.download_artifacts(
            location, dst_path=str(tmp_path / "champion"), tracking_uri=tracking
        )
    )
    objects = [s3_store.get(mlflow_bucket, key) for key in stored]
    assert (local / "MLmodel").read_bytes() in objects
