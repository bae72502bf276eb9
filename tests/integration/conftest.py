"""Background servers and workers of the integration tests (``processes``): each started in its
own session with its output in a log file, stopped (SIGTERM, then stacks and SIGABRT) by the
test or at its end. And ``s3_store``: an S3 API on a loopback port (moto's server) standing in
for the compose stack's MinIO, with its two buckets."""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Put on a worker's PYTHONPATH: SIGUSR1 prints the stacks of its event loop's tasks, so a
# worker that ignores SIGTERM shows what its cancelled main task awaits (thread stacks alone
# show the loop idle in select).
TASK_DUMP = """
import signal
import sys


def _dump_tasks(signum, frame):
    import asyncio

    loop = asyncio._get_running_loop()
    print(f"--- asyncio tasks on SIGUSR1 (loop running: {loop is not None}) ---", file=sys.stderr)
    for task in asyncio.all_tasks(loop) if loop is not None else ():
        print(repr(task), file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


signal.signal(signal.SIGUSR1, _dump_tasks)
"""


def _no_core_files() -> None:
    """In the child before exec: a SIGABRT (below) leaves no core file in the test's folder."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@dataclass
class Processes:
    """Background processes of one test, each in its own session so that stopping it also
    stops what it started (uvicorn workers, flow-run subprocesses)."""

    logs: Path
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    workers: set[str] = field(default_factory=set)  # Prefect workers: stopped together, TASK_DUMP

    def start(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        *,
        worker: bool = False,
    ) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        # faulthandler: a process that ignores SIGTERM gets SIGABRT and writes every thread's
        # stack to its log before it dies (see _stop_together)
        env = {**env, "PYTHONFAULTHANDLER": "1"}
        if worker:
            site = self.logs / "task-dump"
            site.mkdir(exist_ok=True)
            (site / "sitecustomize.py").write_text(TASK_DUMP)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
            self.workers.add(name)
        self.started[name] = subprocess.Popen(
            args,
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_no_core_files,
        )

    def tail(self, name: str, chars: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def tails(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.tail(name)}" for name in self.started)

    def wait_http(self, name: str, url: str, timeout: float = 180) -> None:
        """Until ``url`` answers 200; fail with the process's log if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.started[name].poll() is not None:
                pytest.fail(f"{name} exited ({self.started[name].returncode}):\n{self.tail(name)}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        pytest.fail(f"{name} not answering {url} after {timeout:.0f} s:\n{self.tail(name)}")

    def stop_all(self) -> None:
        """SIGTERM the workers' process groups together, then each server's in reverse start
        order: the workers then stop while the servers they report to still answer (stopped
        together with the servers, each worker retried its last events against the gone server
        until it was killed). Prefect turns a worker's SIGTERM into SIGINT, which cancels the
        worker's main task; under a full suite that cancel is lost (the aborted workers' task
        dumps show them still polling), so the workers share one wait, of 5 s: alone they stop
        in under one, and a second signal would only make Prefect SIGKILL them, as we do."""
        workers = [name for name in self.started if name in self.workers]
        servers = [name for name in reversed(self.started) if name not in self.workers]
        for group, timeout in [(workers, 5), *(([name], 20) for name in servers)]:
            self._record(self._stop_together(group, timeout))

    def stop(self, name: str, timeout: float = 20) -> None:
        """SIGTERM one process's group and wait for it, as :meth:`stop_all` stops a server."""
        self._record(self._stop_together([name], timeout))

    def kill(self, name: str) -> None:
        """SIGKILL one process's group, as a crash ends it: it releases nothing it holds."""
        os.killpg(self.started[name].pid, signal.SIGKILL)
        self.started[name].wait(timeout=10)

    def _record(self, lines: list[str]) -> None:
        # how long each took also goes to logs/stop.log: pytest keeps the last runs' tmp_path,
        # and xdist shows no stderr of a passing test
        with (self.logs / "stop.log").open("a") as record:
            for line in lines:
                print(line, file=sys.stderr)
                print(line, file=record, flush=True)

    def _stop_together(self, names: list[str], timeout: float) -> list[str]:
        begun = time.monotonic()
        for name in names:
            if self.started[name].poll() is None:
                os.killpg(self.started[name].pid, signal.SIGTERM)
        lines, stuck = [], []
        for name in names:
            try:
                self.started[name].wait(timeout=max(0.0, begun + timeout - time.monotonic()))
                lines.append(f"{name} stopped in {time.monotonic() - begun:.1f} s")
            except subprocess.TimeoutExpired:
                lines.append(
                    f"{name} ignored SIGTERM for {timeout:.0f} s: aborted (stacks at the end of "
                    f"{name}.log)"
                )
                stuck.append(name)
        self._abort(stuck)
        return lines

    def _abort(self, names: list[str]) -> None:
        """End processes that ignored SIGTERM, their stacks first in their logs: SIGUSR1 to the
        workers (TASK_DUMP: asyncio tasks), then SIGABRT (faulthandler: threads), then SIGKILL."""
        dumping = [name for name in names if name in self.workers]
        for name in dumping:
            os.kill(self.started[name].pid, signal.SIGUSR1)
        if dumping:
            time.sleep(2)
        for name in names:
            os.killpg(self.started[name].pid, signal.SIGABRT)
        for name in names:
            proc = self.started[name]
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    try:
        yield procs
    finally:
        procs.stop_all()


# ---------------------------------------------------------------- the object store


@dataclass(frozen=True)
class S3Store:
    """An S3 endpoint with the buckets `minio-init` creates (names from .env.example), and the
    environment a client of it needs (the keys are any: the server checks none)."""

    endpoint: str
    buckets: dict[str, str]  # MLFLOW_BUCKET / DVC_BUCKET -> bucket name

    @property
    def env(self) -> dict[str, str]:
        """The environment variables a client process (DVC, the MLflow server) reads its keys
        and region from."""
        return {
            "AWS_ACCESS_KEY_ID": _S3_KEYS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": _S3_KEYS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": _S3_KEYS["region_name"],
        }

    def keys(self, bucket: str) -> list[str]:
        """Every object key in ``bucket``."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]

    def get(self, bucket: str, key: str) -> bytes:
        """The bytes of one object."""
        body: bytes = self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    def client(self) -> Any:
        """A boto3 S3 client of the store."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_S3_KEYS)


_S3_KEYS = {
    "aws_access_key_id": "sidrec",
    "aws_secret_access_key": "not-checked",
    "region_name": "us-east-1",
}


@pytest.fixture
def s3_store(env_example: dict[str, str], free_port: Callable[[], int]) -> Iterator[S3Store]:
    """moto's S3 server on a free loopback port for one test, with the stack's two buckets."""
    from moto.server import ThreadedMotoServer

    buckets = {name: env_example[name] for name in ("MLFLOW_BUCKET", "DVC_BUCKET")}
    port = free_port()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request in reports
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        store = S3Store(endpoint=endpoint, buckets=buckets)
        for bucket in buckets.values():
            store.client().create_bucket(Bucket=bucket)
        yield store
    finally:
        server.stop()
