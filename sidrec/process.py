"""Which process on which host owns something, and whether that process still runs.

A process is named by its host, its pid and its start time: a pid alone may be reused by a
later process after the owner died. MLflow runs carry this name as tags (sidrec/tracking.py)
and staged output files in their temporary names (sidrec/io.py), so that what a killed
process left behind can be recognized and cleaned up, never what a live one still writes.
"""

from __future__ import annotations

import os
import socket


def host() -> str:
    return socket.gethostname()


def started(pid: int | None = None) -> float:
    """The start time of process ``pid`` (this process by default), seconds since the epoch."""
    import psutil

    return float(psutil.Process(pid).create_time())


START_TOLERANCE_S = 2.0
"""How far two readings of one process's start time may differ. psutil adds the process's
start, counted from boot, to the boot time the kernel derives from the wall clock in whole
seconds; NTP's adjustments can move that by a second between two readings. A reused pid
belongs to a process started after the pid space wrapped, far later. (A manual clock step of
more than this makes every process look gone: runs and staging files would then be swept as
orphans; do not step a clock under a running pipeline.)"""


def alive(pid: int, start: float) -> bool:
    """Whether process ``pid`` of this host, started at ``start``, still runs (a pid now held
    by a process started at another time is a different process)."""
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - start) <= START_TOLERANCE_S
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def current() -> tuple[str, int, float]:
    """(host, pid, start time) of this process."""
    return host(), os.getpid(), started()
