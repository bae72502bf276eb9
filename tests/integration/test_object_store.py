"""The compose stack's object store from the DVC side, against an S3 API on loopback (moto's
server standing in for MinIO, ``s3_store``): the workers' DVC remote exactly as
docker-compose.yml configures it, the checkout's remote as docs/operations.md sets it up, and
what an unreachable store does. MLflow's artifacts on the same store are covered by
tests/integration/test_servers.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).parent / "dvc")

pytestmark = pytest.mark.slow


def _dvc(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DVC, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _ok(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = _dvc(args, cwd, env)
    assert proc.returncode == 0, f"dvc {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _digests(root: Path) -> dict[str, str]:
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _dvc_env(tmp_path: Path, name: str, store_env: dict[str, str]) -> tuple[dict[str, str], Path]:
    """DVC's environment on one machine: its own empty system and global config folders (only
    what the test writes there counts) and the store's keys. Returns it and the system folder."""
    system = tmp_path / f"{name}-system"
    system.mkdir()
    env = {**os.environ, **store_env, "DVC_SYSTEM_CONFIG_DIR": str(system)}
    env["DVC_NO_ANALYTICS"] = "1"  # a fresh `dvc init` would otherwise report usage online
    env["DVC_GLOBAL_CONFIG_DIR"] = str(tmp_path / f"{name}-global")
    return env, system


def test_worker_pushes_to_the_compose_remote_and_a_checkout_pulls(
    tmp_path, s3_store, make_project, tiny_project, free_port, monkeypatch
):
    """A worker (no .git, DVC's system config = the compose file's `dvc-remote` entry with
    MinIO's address replaced by the loopback store) pushes SIDs and a model; a checkout that
    added the remote as docs/operations.md says pulls them byte for byte. With the store gone,
    `dvc pull` fails with DVC's message naming the endpoint and checks out nothing."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    content = compose["configs"]["dvc-remote"]["content"]
    bucket = s3_store.buckets["DVC_BUCKET"]
    assert "http://minio:9000" in content and "${DVC_BUCKET:-dvc}" in content
    content = content.replace("${DVC_BUCKET:-dvc}", bucket)
    content = content.replace("http://minio:9000", s3_store.endpoint)

    # the worker: /app without .git, the repo's .dvc/config (as the image copies it)
    worker = tmp_path / "app"
    worker.mkdir()
    make_project(worker)
    monkeypatch.chdir(worker)  # the settings' folders are relative to it
    settings = tiny_project.settings(worker)
    tiny_project.write(settings)
    (worker / ".dvc").mkdir()
    shutil.copy(REPO / ".dvc" / "config", worker / ".dvc" / "config")
    worker_env, system = _dvc_env(tmp_path, "worker", s3_store.env)
    (system / "config").write_text(content)
    tracked = ["data/sids", "artifacts"]
    for path in tracked:
        _ok(["add", path], worker, worker_env)
    pushed = _ok(["push"], worker, worker_env)
    assert re.search(r"\d+ files? pushed", pushed), pushed
    keys = s3_store.keys(bucket)
    assert keys and all(key.startswith("sidrec/files/md5/") for key in keys), keys
    assert json.loads(_ok(["status", "--cloud", "--json"], worker, worker_env)) == {}

    # a checkout elsewhere: its own remote, set up with the documented commands and the same
    # keys from the environment, and the .dvc files from git
    host = tmp_path / "checkout"
    host.mkdir()
    host_env, _ = _dvc_env(tmp_path, "host", s3_store.env)
    _ok(["init", "--no-scm", "-q"], host, host_env)
    _ok(["remote", "add", "-d", "minio", f"s3://{bucket}/sidrec"], host, host_env)
    _ok(["remote", "modify", "minio", "endpointurl", s3_store.endpoint], host, host_env)
    for path in tracked:
        pointer = host / f"{path}.dvc"
        pointer.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(worker / f"{path}.dvc", pointer)
    _ok(["pull"], host, host_env)
    for path in tracked:
        assert _digests(host / path) == _digests(worker / path), path
    assert json.loads(_ok(["status", "--json"], host, host_env)) == {}

    # the store unreachable: a clean failure, nothing checked out
    for path in tracked:
        shutil.rmtree(host / path)
    shutil.rmtree(host / ".dvc" / "cache")
    gone = f"http://127.0.0.1:{free_port()}"
    _ok(["remote", "modify", "minio", "endpointurl", gone], host, host_env)
    failed = _dvc(["pull"], host, host_env)
    assert failed.returncode != 0
    assert f'Could not connect to the endpoint URL: "{gone}/{bucket}/sidrec/' in failed.stderr
    assert not any((host / path).exists() for path in tracked)
