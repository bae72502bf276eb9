"""Benchmark: latency and errors of the served champion behind `mlflow models serve`.

    python -m bench.serving                       # in a folder where `make run` registered a model
    python -m bench.serving --requests 100 --clients 8 --seconds 60
    python -m bench.serving --set register.model_name=other   # another registered model

Starts ``mlflow models serve -m models:/<register.model_name>@champion --env-manager local``
on loopback (the folder's MLflow store: ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``),
waits for ``/ping``, warms it up, then measures with histories of real users (their most recent
``split.max_history`` items, from ``data/validated``):

- one user per request, ``--requests`` requests one after another;
- 64 users per request, ``--requests`` / 4 requests one after another;
- a bounded load: ``--clients`` threads sending one-user requests for ``--seconds``; every
  non-200 answer or connection failure counts as an error;
- one request whose history holds unknown item ids (it must be answered, with them named).

Prints a markdown table (p50 / p99 milliseconds, requests, errors) and stops the server. The
clients share the machine's cores with the server, as they would on one serving host.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

import numpy as np

from bench.common import bench_args

BATCH = 64


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )
    parser.add_argument("--requests", type=int, default=200, help="sequential single requests")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients under load")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the load test")
    parser.add_argument("--startup-timeout", type=float, default=300.0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(url: str, histories: list[list[str]], timeout: float = 60.0) -> tuple[int, Any]:
    body = json.dumps({"dataframe_records": [{"history": h} for h in histories]}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def _timed(url: str, histories: list[list[str]]) -> tuple[float, bool]:
    started = time.perf_counter()
    status, _ = _post(url, histories)
    return (time.perf_counter() - started) * 1000, status == 200


def _wait_ready(
    base: str, server: subprocess.Popen[bytes], timeout: float, log_file: IO[bytes]
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log_file.seek(0)
            tail = log_file.read().decode(errors="replace")
            raise RuntimeError(
                f"mlflow models serve exited with {server.returncode}: {tail[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"{base}/ping", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise RuntimeError(f"the server did not answer /ping within {timeout:.0f} s")


def _load(url: str, histories: list[list[str]], clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(offset: int) -> None:
        n = offset
        while time.monotonic() < stop:
            ms, ok = _timed(url, [histories[n % len(histories)]])
            with lock:
                latencies.append(ms)
                errors[0] += not ok
            n += clients

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "ms": latencies,
        "errors": errors[0],
        "per_second": len(latencies) / (time.monotonic() - started),
    }


def _row(name: str, ms: list[float], errors: int, extra: str = "") -> str:
    p50, p99 = np.percentile(ms, [50, 99]) if ms else (float("nan"), float("nan"))
    return f"| {name} | {p50:.0f} | {p99:.0f} | {len(ms)} | {errors} | {extra} |"


def main() -> None:
    args = bench_args(__doc__, _options)
    from sidrec.config import load_settings
    from sidrec.registry import model_name
    from tasks.recommend import user_histories

    settings = load_settings(args.params, args.overrides)
    cap = settings.split.max_history
    histories = [list(h)[-cap:] for h in user_histories(settings)["history"]]
    uri = f"models:/{model_name(settings)}@champion"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
        # mlflow starts `uvicorn` by name: the venv's scripts must be on PATH
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri]
    command += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    # the server's log goes to a file: its access lines would fill a pipe and stall it
    with tempfile.TemporaryFile() as log_file:
        server = subprocess.Popen(
            command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            started = time.perf_counter()
            _wait_ready(base, server, args.startup_timeout, log_file)
            ready_s = time.perf_counter() - started
            url = f"{base}/invocations"
            for history in histories[:5]:  # warm-up: first-call allocations
                _post(url, [history])
            single = [_timed(url, [histories[i % len(histories)]]) for i in range(args.requests)]
            batches = [
                _timed(url, [histories[(i * BATCH + j) % len(histories)] for j in range(BATCH)])
                for i in range(max(1, args.requests // 4))
            ]
            load = _load(url, histories, args.clients, args.seconds)
            status, answer = _post(url, [["no-such-item", *histories[0]], ["no-such-item"]])
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(timeout=60)

    unknown_ok = (
        status == 200
        and answer["predictions"][0]["unknown_items"] == ["no-such-item"]
        and answer["predictions"][1]["fallback"] is True
    )
    print(
        f"{uri} on {base}, {settings.evaluate.num_beams} beams, histories of <= {cap} items "
        f"from {len(histories)} users; server ready after {ready_s:.0f} s; {os.cpu_count()} CPUs"
    )
    print("| requests | p50 ms | p99 ms | requests sent | errors | |")
    print("|---|---|---|---|---|---|")
    print(_row("1 user, sequential", [ms for ms, _ in single], sum(not ok for _, ok in single)))
    print(
        _row(
            f"{BATCH} users, sequential",
            [ms for ms, _ in batches],
            sum(not ok for _, ok in batches),
        )
    )
    print(
        _row(
            f"1 user, {args.clients} clients for {args.seconds:.0f} s",
            load["ms"],
            load["errors"],
            f"{load['per_second']:.1f} requests/s",
        )
    )
    print(
        f"unknown history items answered and named, popularity for an unknown-only history: {unknown_ok}"
    )


if __name__ == "__main__":
    main()
