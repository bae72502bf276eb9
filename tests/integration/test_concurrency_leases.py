"""A dataset's retrain slot (flows/lock.py) survives a restart of the compose stack's Prefect
server: the server keeps its concurrency leases where docker-compose.yml says
(``PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE``, in ``PREFECT_HOME`` on a volume), so a slot that
a run held when the server stopped, and that no one renews or releases since, is freed once its
lease runs out. With Prefect's default (leases in memory) the restarted server knows no lease,
and the slot stays taken in the database until someone frees it by hand.

Runs ``prefect server start`` on a free loopback port with SQLite in the test's folder, twice on
the same folder, and a stand-in retrain that takes the slot through ``dataset_lock`` and is then
killed. Takes a little over a minute: the shortest lease the API grants is 60 s.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from flows.lock import lock_name

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DATASET = "itest"
LEASE_S = 60.0
"""The shortest lease Prefect's API grants (``POST /v2/concurrency_limits/increment-with-lease``
takes ``lease_duration >= 60``); flows/lock.py asks for 300 s."""
REPOSSESSOR_S = 1
"""How often the server looks for expired leases (Prefect's default: 15 s)."""
GRACE_S = 30.0
"""How long after its lease ran out the slot may still be counted (repossessor passes, a busy
machine)."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# A run that holds the dataset's slot as a retrain does, with a short lease, until it is killed:
# it then neither renews the lease nor releases the slot.
HOLDER = """
import sys
import time

import flows.lock

flows.lock.LEASE_S = float(sys.argv[2])
with flows.lock.dataset_lock(sys.argv[1], timeout_s=30):
    print("holding", flush=True)
    time.sleep(600)
"""


def compose_lease_settings() -> dict[str, str]:
    """The compose ``prefect-server``'s lease storage, after checking that its PREFECT_HOME,
    where the file storage writes, is a named volume (so it outlives the container)."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    service = compose["services"]["prefect-server"]
    env = service["environment"]
    mounts = dict(reversed(v.split(":")[:2]) for v in service.get("volumes", []))
    assert mounts.get(env.get("PREFECT_HOME")) in compose["volumes"], (
        f"prefect-server: PREFECT_HOME {env.get('PREFECT_HOME')} is not a named volume: "
        f"{service.get('volumes')}"
    )
    return {
        "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": env["PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"]
    }


def wait_for_slots(
    active_slots: Callable[[str], int],
    name: str,
    count: int,
    deadline: float,
    logs: Callable[[], str],
) -> float:
    """Until the limit counts ``count`` taken slots; returns when (``time.monotonic()``)."""
    while (seen := active_slots(name)) != count:
        assert time.monotonic() < deadline, f"{name}: {seen} slot(s) taken, not {count}\n{logs()}"
        time.sleep(0.5)
    return time.monotonic()


def test_slot_of_a_dead_run_is_freed_after_a_server_restart(
    tmp_path: Path, processes, free_port, active_slots
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    home = tmp_path / "prefect-home"  # the SQLite database and the leases
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": str(REPOSSESSOR_S),
        **compose_lease_settings(),
    }
    server = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    processes.start("prefect-server", server, env, tmp_path)
    processes.wait_http("prefect-server", f"{api}/health")
    # this checkout's flows/, whatever the environment's editable install points at
    holder_env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    }
    holder = [sys.executable, "-c", HOLDER, DATASET, str(LEASE_S)]
    processes.start("holder", holder, holder_env, tmp_path)
    name = lock_name(DATASET)

    with temporary_settings(updates={PREFECT_API_URL: api}):
        # the lease is made with the slot, so it runs out at most LEASE_S from here
        taken = wait_for_slots(active_slots, name, 1, time.monotonic() + 60, processes.tails)
        processes.kill("holder")
        processes.stop("prefect-server")
        # in PREFECT_HOME, which docker-compose.yml keeps on a volume
        leases = home / "concurrency_leases"
        assert {p.name for p in leases.glob("*.json")} - {"expirations.json"}, (
            f"no lease in {leases}"
        )
        processes.start("prefect-server-again", server, env, tmp_path)
        processes.wait_http("prefect-server-again", f"{api}/health")
        restarted = time.monotonic()
        assert restarted < taken + LEASE_S, "the restart outlasted the lease: nothing to show"
        assert active_slots(name) == 1, "the restart itself freed the slot"
        wait_for_slots(active_slots, name, 0, taken + LEASE_S + GRACE_S, processes.tails)
