"""One state for Prefect runs and ``dvc repro``: what a Prefect run made is committed to DVC.

After a run made from ``params.yaml`` as it is (no ``--set``, no deployment overrides), the
stages it ran are recorded with ``dvc commit --force <stages>``: DVC hashes each stage's
dependencies, parameters and outputs as they are on disk, writes them into ``dvc.lock`` and
puts the outputs into its cache. ``dvc status`` is then clean, ``dvc repro`` has nothing to do
and ``dvc push`` can share the outputs.

Why commit after the run instead of running ``dvc repro <stage>`` from each Prefect task: the
tasks keep Prefect's own caching, retries and artifacts, may run on another machine (the
``gpu`` pool) that shares the project folder, and DVC holds one lock per repository, so a
``dvc repro`` inside a task would serialize the whole flow behind it. Committing once at the
end records exactly what is on disk.

A run with overrides is not recorded: its outputs come from values ``params.yaml`` does not
hold, and ``dvc.lock`` must never claim parameters that did not produce them. Such a run
leaves ``dvc.lock`` untouched and says so (the stages it changed show in ``dvc status``).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_S = 600


def dvc_stages(root: Path) -> list[str]:
    """The stage names of ``root/dvc.yaml`` (empty when there is none)."""
    path = root / "dvc.yaml"
    if not path.is_file():
        return []
    return list((yaml.safe_load(path.read_text()) or {}).get("stages", {}))


def record_in_dvc(
    stages: Iterable[str],
    *,
    config_path: str | Path,
    overrides: Sequence[str],
    root: Path | None = None,
) -> str:
    """Commit ``stages`` (those that ran) to the DVC project at ``root`` (default: the current
    folder) when the run used its ``params.yaml`` without overrides; otherwise leave
    ``dvc.lock`` untouched. Returns one line saying which, for the run's log.

    A failing ``dvc commit`` does not fail the run (its outputs are complete): the message
    says what DVC reported and how to record the outputs by hand.
    """
    root = Path.cwd() if root is None else root
    known = dvc_stages(root)
    if not known or not (root / ".dvc").is_dir():
        return "dvc: not a DVC project here (no dvc.yaml and .dvc/), nothing recorded"
    params = root / "params.yaml"
    if Path(config_path).resolve() != params.resolve():
        return f"dvc: dvc.lock left untouched: this run read {config_path}, not {params.name}"
    if overrides:
        return (
            "dvc: dvc.lock left untouched: this run's overrides "
            f"({', '.join(overrides)}) are not in params.yaml, so its outputs do not match it"
        )
    ran = [stage for stage in known if stage in set(stages)]
    if not ran:
        return "dvc: no DVC stage ran, nothing recorded"
    command = [sys.executable, "-m", "dvc", "commit", "--force", "--quiet", *ran]
    try:
        proc = subprocess.run(
            command, cwd=root, capture_output=True, text=True, timeout=COMMIT_TIMEOUT_S
        )
        failed = proc.returncode != 0
        output = proc.stderr or proc.stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed, output = True, f"{type(exc).__name__}: {exc}"
    if failed:
        detail = output.strip().splitlines()[-1:] or ["no output"]
        log.warning("dvc commit failed: %s", output)
        return (
            f"dvc: recording failed ({detail[0]}); the outputs are complete, "
            f"record them with `dvc commit --force {' '.join(ran)}`"
        )
    return f"dvc: recorded {', '.join(ran)} in dvc.lock and the DVC cache"
