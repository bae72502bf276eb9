"""What every benchmark script starts with, and how a benchmark runs the stages in a folder."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import logging
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import torch

from sidrec.config import Settings, load_settings
from sidrec.errors import InputError
from sidrec.io import atomic_write_json, read_json
from sidrec.paths import DatasetPaths
from sidrec.stage import STAGES, Stage, StageResult

REPO = Path(__file__).resolve().parent.parent
OUTPUT_DIRS = ("data", "metrics", "artifacts")
"""The output folders of a run in its own folder (``<work>/data``, ``<work>/metrics``, ...)."""


def bench_args(
    doc: str | None, parser_setup: Callable[[argparse.ArgumentParser], object] | None = None
) -> argparse.Namespace:
    """Parse ``--threads`` (default 2, the target machine) plus script options; set torch threads."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    if parser_setup is not None:
        parser_setup(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    # TRL calls transformers APIs that warn about their v6 renames on every step
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    logging.basicConfig(level=logging.WARNING)
    return args


def folder_overrides(work: Path) -> list[str]:
    """Overrides that put every output of a run under ``work``: its data, metrics, artifacts and
    run configs, and a cold embedding cache (a later ``embed.cache_dir=`` override shares one)."""
    return [
        *(f"project.{d}_dir={work / d}" for d in (*OUTPUT_DIRS, "runs")),
        f"embed.cache_dir={work / 'cache'}",
    ]


def folder_paths(work: Path, dataset: str) -> DatasetPaths:
    """Where the stages wrote a run made with :func:`folder_overrides` (``work``)."""
    return DatasetPaths(
        data_dir=work / "data",
        metrics_dir=work / "metrics",
        artifacts_dir=work / "artifacts",
        dataset=dataset,
    )


def folder_settings(work: Path, overrides: Sequence[str] = ()) -> Settings:
    """The repo's params.yaml with the outputs under ``work``; ``overrides`` come last and win."""
    return load_settings(REPO / "params.yaml", [*folder_overrides(work), *overrides])


class StagesRun(NamedTuple):
    """What :func:`run_stages` ran: the settings, each stage's result and its seconds."""

    settings: Settings
    results: dict[Stage, StageResult]
    seconds: dict[Stage, float]


def run_stages(
    work: Path,
    overrides: Sequence[str] = (),
    *,
    start: Stage = STAGES[0],
    until: Stage = STAGES[-1],
) -> StagesRun:
    """Every stage function in order from ``start`` (the earlier ones' outputs must be in
    ``work``) up to ``until`` (as `make run` runs them, without Prefect; the grpo stage not
    under ``grpo.enabled: false``, as the training flow leaves it out), each timed, with
    :func:`folder_settings` (all outputs under ``work``). Runs inside ``work`` with MLflow
    tracking in ``work/mlflow.db``; the working directory and ``MLFLOW_TRACKING_URI`` are
    restored afterwards."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    settings = folder_settings(work, overrides)
    results: dict[Stage, StageResult] = {}
    seconds: dict[Stage, float] = {}
    with _inside(work):
        for stage in STAGES[STAGES.index(start) : STAGES.index(until) + 1]:
            if stage == "grpo" and not settings.grpo.enabled:
                continue
            stage_fn = getattr(importlib.import_module(f"tasks.{stage}"), stage)
            started = time.perf_counter()
            results[stage] = stage_fn(settings)
            seconds[stage] = time.perf_counter() - started
    return StagesRun(settings, results, seconds)


@contextlib.contextmanager
def _inside(work: Path) -> Iterator[None]:
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
    try:
        with contextlib.chdir(work):
            yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


RUN_RECORD = "bench-run.json"
"""Written into a run folder when its stages finished: what ran, with which settings, how long."""


def run_record(folder: Path, missing_hint: str) -> dict[str, Any]:
    """The record of the finished run in ``folder`` (see :func:`ensure_run`); a clear error for
    a missing or unfinished run folder, with ``missing_hint`` (how to make it)."""
    if not folder.is_dir():
        raise InputError(f"run folder not found; {missing_hint}", path=folder)
    hint = f"the run there did not finish; {missing_hint}"
    record: dict[str, Any] = read_json(folder / RUN_RECORD, "run record", hint)
    return record


_MAKE_RUN = "run `python -m bench.quality` there first"
"""How a missing or unfinished run folder is made (the hint of :func:`run_record`'s errors)."""


def run_settings(folder: Path, overrides: Sequence[str] = ()) -> Settings:
    """The settings the finished run in ``folder`` ran with (its record's overrides, its own
    output folders), ``overrides`` after them."""
    record = run_record(folder, _MAKE_RUN)
    return folder_settings(folder.resolve(), [*record["overrides"], *overrides])


def copy_finished(source: Path, copy: Path, needs: Stage) -> dict[str, Any]:
    """Copy the finished run folder ``source`` (one of :mod:`bench.quality`, run at least until
    ``needs``) to the new folder ``copy`` and return the source's record. The copy gets no
    record of its own until its stages finish (a failed re-run reads as unfinished); an
    existing copy is refused, never overwritten."""
    record = run_record(source, _MAKE_RUN)
    if STAGES.index(record["until"]) < STAGES.index(needs):
        raise InputError(f"the run there stopped after {record['until']}", path=source)
    if copy.exists():
        raise InputError("the copy's folder exists already; choose a new one", path=copy)
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns(RUN_RECORD))
    return record


DIGEST_NEUTRAL: dict[tuple[str, str], Any] = {("sasrec", "lr_schedule"): "constant"}
"""Keys added after runs were recorded, each with the value whose code path those runs took:
a digest leaves the key out while it holds that value, so their records stay current."""


def settings_digest(
    folder: Path, overrides: Sequence[str], sections: Sequence[str] | None = None
) -> str:
    """SHA-256 of a run's resolved settings (``sections`` of them only, if given; the keys of
    :data:`DIGEST_NEUTRAL` at their neutral value left out), with paths inside ``folder`` or the
    repo written relative to them: a folder that travels inside its repo (prepared on one
    machine, trained on another) keeps its digest."""
    folder = folder.resolve()
    resolved = folder_settings(folder, overrides).to_yaml_dict()
    for (section, key), neutral in DIGEST_NEUTRAL.items():
        if resolved.get(section, {}).get(key, neutral) == neutral:
            resolved.get(section, {}).pop(key, None)
    if sections is not None:
        resolved = {k: v for k, v in resolved.items() if k in sections}
    text = json.dumps(resolved, sort_keys=True)
    text = text.replace(str(folder), "<run>").replace(str(REPO), "<repo>")
    return hashlib.sha256(text.encode()).hexdigest()


def ensure_run(
    folder: Path, overrides: list[str], until: Stage, *, start: Stage = STAGES[0]
) -> dict[str, Any]:
    """:func:`run_stages` from ``start`` until ``until`` in ``folder`` and its record written
    last (stage seconds, settings digest, machine), unless a finished run there already got that
    far with the same settings: then only its record is returned.

    With ``start`` after the first stage, the earlier stages must have finished there with the
    same settings (a run until the stage before ``start``, e.g. on a CPU before training on a
    GPU): their seconds are kept and their machine is recorded as ``prepared_on``. A finished
    run with the same settings that stopped before ``until`` goes on from its next stage."""
    folder = folder.resolve()
    digest = settings_digest(folder, overrides)
    path = folder / RUN_RECORD
    record: dict[str, Any] | None = json.loads(path.read_text()) if path.exists() else None
    same = record is not None and record["settings_sha256"] == digest
    if record is not None and same and STAGES.index(record["until"]) >= STAGES.index(until):
        return record
    if record is not None and same and start == STAGES[0]:  # go on where the run stopped
        start = STAGES[STAGES.index(record["until"]) + 1]
    first = STAGES.index(start)
    prepared: dict[str, Any] | None = None
    if first > 0:
        before = STAGES[first - 1]
        if record is None or not same or STAGES.index(record["until"]) < first - 1:
            raise InputError(
                f"the stages until {before} have not finished there with these settings; "
                f"prepare the folder with the same options and --until {before} first",
                path=folder,
            )
        prepared = prepared_by(record, start)
    print(f"running the stages {start}..{until} in {folder}", file=sys.stderr, flush=True)
    if prepared is None:  # unfinished until the new record is written (a prepared folder's
        path.unlink(missing_ok=True)  # record stays true of its stages: a failed run can retry)
    run = run_stages(folder, overrides, start=start, until=until)
    return write_run_record(folder, overrides, until, run.seconds, prepared)


def prepared_by(record: dict[str, Any], start: Stage) -> dict[str, Any]:
    """What a run from ``start`` keeps of the :data:`RUN_RECORD` of the run that made its
    inputs: the last stage before ``start``, those stages' seconds and their machine."""
    first = STAGES.index(start)
    return {
        "until": STAGES[first - 1],
        "seconds": {s: v for s, v in record["seconds"].items() if s in STAGES[:first]},
        "machine": record.get("prepared_on", {}).get("machine", record["machine"]),
    }


def write_run_record(
    folder: Path,
    overrides: Sequence[str],
    until: Stage,
    seconds: dict[Stage, float],
    prepared: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``folder``'s :data:`RUN_RECORD` (last, atomically) for a run that just finished
    ``until`` with ``overrides``: ``seconds`` per stage it ran, and where the stages before it
    ran (``prepared``: ``until``, their ``seconds`` and ``machine``), if not in this run."""
    settings = folder_settings(folder, overrides)
    ran = {stage: round(s, 1) for stage, s in seconds.items()}
    record: dict[str, Any] = {
        "dataset": settings.project.dataset,
        "seed": settings.project.seed,
        "until": until,
        "overrides": list(overrides),
        "settings_sha256": settings_digest(folder, overrides),
        "seconds": ran if prepared is None else {**prepared["seconds"], **ran},
        "machine": machine(),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if prepared is not None:
        record["prepared_on"] = {"until": prepared["until"], "machine": prepared["machine"]}
    baselines = settings.paths.metrics("baselines")
    if "baselines" in ran and baselines.exists():
        resumed = json.loads(baselines.read_text()).get("resumed_after_epoch", 0)
        if resumed:  # its seconds are those of the epochs after it only
            record["resumed"] = {"baselines": resumed}
    atomic_write_json(folder / RUN_RECORD, record)
    return record


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "platform": platform.platform(),
        "torch": torch.__version__,
    }


def per_user_scores(run: Path, split: str, model: str, metrics: Sequence[str]) -> Any:
    """``metrics`` of ``model`` on ``split`` per user (a DataFrame indexed by user_id), from the
    run folder's ``metrics/eval_users.parquet`` (written by ``evaluate``: ``valid``, its gate
    half, and ``test``) or, for ``selection`` (the other half of valid),
    ``metrics/selection_users.parquet`` (written by ``bench.experiments.breakdown``); one row
    per user."""
    import pandas as pd

    if split == "selection":
        path = run / "metrics" / "selection_users.parquet"
        hint = "run `python -m bench.experiments.breakdown` on the folder first"
    else:
        path, hint = run / "metrics" / "eval_users.parquet", "run `sidrec evaluate` there first"
    if not path.exists():
        raise InputError(f"no per-user scores; {hint}", path=path)
    table = pd.read_parquet(path)
    rows = table[(table["split"] == split) & (table["model"] == model)]
    if rows.empty:
        raise InputError(f"no {split} rows of model {model!r}", path=path)
    repeated = rows["user_id"][rows["user_id"].duplicated()]
    if not repeated.empty:  # pairing by user would multiply such a user's rows
        raise InputError(
            f"{repeated.nunique()} user(s) have several {split} rows (e.g. "
            f"{repeated.iloc[0]!r}: a sliding-window split); a paired comparison needs one row "
            "per user, as a leave-one-out split has",
            path=path,
        )
    return rows.set_index("user_id")[list(metrics)]
