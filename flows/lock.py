"""One retrain per dataset at a time, whichever deployment or ``sidrec pipeline`` started it.

A deployment's ``concurrency_limit`` (``prefect.yaml``) is a limit of that deployment alone
(``deployment:<id>`` on the server): it keeps two ``retrain-weekly`` runs apart, but not a
``retrain-weekly`` run from a ``retrain-manual`` one, nor from a ``sidrec pipeline`` run. Two
retrains of one dataset would write the same data/, artifacts/ and metrics/ files and race to
register. So a retrain holds the dataset's Prefect global concurrency limit
``sidrec-retrain-<dataset>`` (one slot; the first run that asks creates it) while it runs its
stages: a second run of the dataset says in its log that it waits, and starts when the first
releases the slot (when it ends, fails or is cancelled), or fails after
``orchestration.lock_timeout_s``.

The slot is a lease the holder renews (every 225 s of a 300 s lease): a run killed outright
leaves it taken until the lease runs out, and a run that cannot renew it stops rather than go on
unguarded, as Prefect stops a deployment run that cannot renew its deployment's lease. The
server must keep its leases where a restart does not lose them (docker-compose.yml: the
``filesystem`` lease storage on a volume); one keeping them in memory, Prefect's default, forgets
them when it restarts, and nothing then frees the slots they held.

Without a Prefect server (no ``PREFECT_API_URL``: the ephemeral API of ``make run``) no slot is
taken: that API expires no leases, so a slot a killed run left taken would stay taken in the
local database, and every later run of the dataset would wait for nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import PREFECT_API_URL

from flows.common import run_logger
from sidrec.errors import SidrecError

LEASE_S = 300.0
"""How long the slot stays taken without a renewal (Prefect's own for deployment limits)."""


class RetrainLockTimeout(SidrecError):
    """Another run held the dataset longer than ``orchestration.lock_timeout_s``."""


def lock_name(dataset: str) -> str:
    """The dataset's global concurrency limit (``prefect gcl inspect <name>``)."""
    return f"sidrec-retrain-{dataset}"


@contextmanager
def dataset_lock(dataset: str, *, timeout_s: int) -> Iterator[None]:
    """Hold the dataset's slot for the block, waiting up to ``timeout_s`` for another run to
    release it (then :class:`RetrainLockTimeout`); released however the block ends."""
    logger = run_logger()
    if not PREFECT_API_URL.value():
        logger.info(
            "no Prefect server set (PREFECT_API_URL; a temporary local API runs this): runs "
            "of dataset %s do not wait for each other",
            dataset,
        )
        yield
        return
    name = lock_name(dataset)
    waits = _taken(name)
    if waits:
        logger.info(
            "dataset %s: this run waits for another retrain of it to end (Prefect global "
            "concurrency limit %r; up to orchestration.lock_timeout_s=%d s)",
            dataset,
            name,
            timeout_s,
        )
    started = time.monotonic()
    with ExitStack() as held:
        try:
            held.enter_context(
                concurrency(
                    name,
                    occupy=1,
                    timeout_seconds=timeout_s,
                    lease_duration=LEASE_S,
                    strict=True,  # the limit exists (_taken made it); renewals must not fail
                    holder=_holder(),
                )
            )
        except TimeoutError:
            raise RetrainLockTimeout(
                f"dataset {dataset}: another run held Prefect global concurrency limit "
                f"{name!r} longer than orchestration.lock_timeout_s={timeout_s} s. Wait for it "
                "to end (Prefect UI: Concurrency), or raise the timeout; if no run of the "
                "dataset is running (a server keeping leases in memory, Prefect's default, "
                "restarted while one held it), free the slot: "
                f"`prefect gcl update {name} --active-slots 0`"
            ) from None
        if waits:
            logger.info(
                "dataset %s: the other retrain ended after %.0f s of waiting; this run goes on",
                dataset,
                time.monotonic() - started,
            )
        yield


def _taken(name: str) -> bool:
    """Whether the limit's slot is taken now (only to say that a run waits); creates the
    limit, with one slot, if it does not exist yet. An existing limit is left as it is: an
    operator may disable it (`prefect gcl disable`) to let runs of the dataset overlap."""
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with suppress(ObjectAlreadyExists):  # another run created it meanwhile
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1)
                )
            limit = client.read_global_concurrency_limit_by_name(name)
    return limit.active and limit.active_slots >= limit.limit


def _holder() -> ConcurrencyLeaseHolder | None:
    """The flow run holding the slot, shown with its lease."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    return ConcurrencyLeaseHolder(type="flow_run", id=ctx.flow_run.id)
