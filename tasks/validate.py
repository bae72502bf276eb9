"""Stage 2 — validate: Great Expectations suites over the raw tables, then the minimum-activity
user filter, then the drift report of this load against the last accepted one
(``metrics/drift.json``, ``models/drift.py``). Writes ``data/validated/<ds>/`` and keeps this
load's profile (``data/drift/<ds>/``) only when everything passes; on failure writes the
report (``metrics/validation.json``) and raises, so nothing downstream is written or replaced."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task

from models.drift import (
    LoadProfile,
    compare_loads,
    drift_line,
    drift_markdown,
    profile_load,
    read_profiles,
    write_profiles,
)
from sidrec.config import Settings, ValidateConfig
from sidrec.errors import InputError, ValidationFailed
from sidrec.io import AtomicOutputs, read_json
from sidrec.orchestration import StageCache, publish_markdown, publish_stats
from sidrec.paths import DatasetPaths
from sidrec.protocol import fingerprint
from sidrec.schemas import INTERACTIONS, ITEMS
from sidrec.stage import StageResult, dataset_line

log = logging.getLogger(__name__)

STRING_TYPES = ["StringDtype", "object"]
INT_TYPES = ["Int64Dtype", "int64"]
_READ_TYPES = {
    pa.int64(): pd.Int64Dtype(),
    pa.string(): pd.StringDtype(),
    pa.large_string(): pd.StringDtype(),
}


def read_raw(path: Path) -> pd.DataFrame:
    """A raw table with nullable dtypes, as Great Expectations should see it."""
    if not path.exists():
        raise InputError("raw table not found; run `sidrec ingest` first", path=path)
    try:
        return pq.read_table(path).to_pandas(types_mapper=_READ_TYPES.get)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"raw table is not readable Parquet ({exc})", path=path) from None


def expectations(table: str, cfg: ValidateConfig) -> list[Any]:
    """The expectation suite for ``interactions``, ``items`` or ``catalog_misses`` (the
    interactions' item ids missing from the catalog, :func:`catalog_misses`)."""
    import great_expectations as gx

    E = gx.expectations
    if table == "interactions":
        now = dt.datetime.now(dt.UTC)
        lo = int(dt.datetime.combine(cfg.min_date, dt.time(), tzinfo=dt.UTC).timestamp())
        hi = int((now + dt.timedelta(days=cfg.max_future_days)).timestamp())
        return [
            E.ExpectTableRowCountToBeBetween(min_value=1, max_value=cfg.max_interactions),
            *[E.ExpectColumnToExist(column=c) for c in INTERACTIONS.names],
            E.ExpectColumnValuesToBeInTypeList(column="user_id", type_list=STRING_TYPES),
            E.ExpectColumnValuesToBeInTypeList(column="item_id", type_list=STRING_TYPES),
            E.ExpectColumnValuesToBeInTypeList(column="timestamp", type_list=INT_TYPES),
            *[E.ExpectColumnValuesToNotBeNull(column=c) for c in INTERACTIONS.names],
            E.ExpectCompoundColumnsToBeUnique(column_list=list(INTERACTIONS.names)),
            E.ExpectColumnValuesToBeBetween(column="timestamp", min_value=lo, max_value=hi),
        ]
    if table == "catalog_misses":  # every interaction's item is in the catalog
        return [E.ExpectColumnValuesToBeInSet(column="item_id", value_set=[])]
    return [
        E.ExpectTableRowCountToBeBetween(min_value=1, max_value=cfg.max_items),
        *[E.ExpectColumnToExist(column=c) for c in ITEMS.names],
        E.ExpectColumnValuesToBeInTypeList(column="item_id", type_list=STRING_TYPES),
        E.ExpectColumnValuesToBeInTypeList(column="title", type_list=STRING_TYPES),
        *[E.ExpectColumnValuesToNotBeNull(column=c) for c in ITEMS.names],
        E.ExpectColumnValuesToBeUnique(column="item_id"),
        E.ExpectColumnValuesToNotMatchRegex(column="title", regex=r"^\s*$"),
    ]


def run_expectations(
    frames: dict[str, pd.DataFrame], cfg: ValidateConfig
) -> tuple[int, list[dict[str, Any]]]:
    """Validate each table with an ephemeral GX context; returns (checks run, failures)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)  # its INFO is noise here
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("sidrec")
    suites = {
        "items": frames["items"],
        "interactions": frames["interactions"],
        "catalog_misses": catalog_misses(frames["interactions"], frames["items"]),
    }
    checked, failures = 0, []
    for suite_name, df in suites.items():
        table = "items" if suite_name == "items" else "interactions"
        asset = source.add_dataframe_asset(suite_name)
        batch_def = asset.add_batch_definition_whole_dataframe("all")
        suite = gx.ExpectationSuite(
            name=f"sidrec-{suite_name}", expectations=expectations(suite_name, cfg)
        )
        batch = batch_def.get_batch(batch_parameters={"dataframe": df})
        result = batch.validate(
            suite,
            result_format={
                "result_format": "COMPLETE",
                "partial_unexpected_count": cfg.sample_size,
            },
        )
        checked += len(result.results)
        absent = {c for c in _expected_columns(table) if c not in df.columns}
        for res in result.results:
            if res.success:
                continue
            failure = _failure(table, res, cfg.sample_size)
            # a missing column is reported once, by its ExpectColumnToExist
            if failure["column"] in absent and failure["expectation"] != "expect_column_to_exist":
                continue
            failures.append(failure)
    return checked, failures


def catalog_misses(inter: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """Each interaction's ``item_id`` where the catalog lacks it, null elsewhere (row index kept).

    GX checks this column against an empty value set, so exactly the interactions whose item
    is not in the catalog fail, with GX's counts, rows and sample values. The catalog itself is
    not the value set: GX copies an expectation's value_set at each of its ~100 internal reads
    of the expectation per validation, over a minute at 10^6 items (bench/scale.py)."""
    if "item_id" not in inter:  # reported once, by the interactions' ExpectColumnToExist
        return pd.DataFrame(index=inter.index)
    catalog = items["item_id"].dropna().astype(str).unique() if "item_id" in items else []
    ids = inter["item_id"]
    return pd.DataFrame({"item_id": ids.where(~ids.isin(catalog))}, index=inter.index)


def _expected_columns(table: str) -> list[str]:
    return list((INTERACTIONS if table == "interactions" else ITEMS).names)


def _failure(table: str, res: Any, sample: int) -> dict[str, Any]:
    kwargs = res.expectation_config.kwargs
    column = kwargs.get("column") or ",".join(kwargs.get("column_list") or []) or None
    r = res.result or {}
    out: dict[str, Any] = {
        "table": table,
        "expectation": res.expectation_config.type,
        "column": column,
    }
    if "unexpected_count" in r:
        out["unexpected_count"] = int(r["unexpected_count"])
        out["rows_checked"] = int(r.get("element_count", 0))
        out["sample_values"] = [
            _plain(v) for v in (r.get("partial_unexpected_list") or [])[:sample]
        ]
        out["sample_rows"] = [
            _plain(v) for v in (r.get("partial_unexpected_index_list") or [])[:sample]
        ]
    if "observed_value" in r:
        out["observed"] = _plain(r["observed_value"])
    for key in ("min_value", "max_value"):
        if kwargs.get(key) is not None:
            out[key] = kwargs[key]
    return out


def _plain(value: Any) -> Any:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return None
    return value.item() if hasattr(value, "item") else value


def filter_users(inter: pd.DataFrame, min_interactions: int) -> tuple[pd.DataFrame, int]:
    """Drop users with fewer than ``min_interactions`` interactions; returns (kept, users dropped)."""
    counts = inter["user_id"].value_counts()
    keep = inter["user_id"].map(counts) >= min_interactions
    return inter[keep].reset_index(drop=True), int((counts < min_interactions).sum())


def summarize(
    dataset: str,
    files: dict[str, str],
    failures: list[dict[str, Any]],
    rows_are: dict[str, str] | None = None,
) -> str:
    """One readable paragraph per failure: which table/column, which expectation, how many rows
    (``rows_are``: per table, what its row numbers count; by default the data rows)."""
    lines = [f"Validation of dataset '{dataset}' failed ({len(failures)} check(s)):"]
    for f in failures:
        where = f"{files.get(f['table'], f['table'])}" + (
            f", column '{f['column']}'" if f["column"] else ""
        )
        text = f"  - {where}: {f['expectation']}"
        if "unexpected_count" in f:
            text += f" — {f['unexpected_count']} of {f['rows_checked']} row(s) fail"
            if f["sample_rows"]:
                counted = (rows_are or {}).get(f["table"], "0 = the first data row")
                text += f"; rows {f['sample_rows']} ({counted})"
            if f["sample_values"]:
                text += f"; sample values {f['sample_values']}"
        elif "observed" in f:
            text += f" — observed {f['observed']!r}"
        if "min_value" in f or "max_value" in f:
            text += f" (allowed {f.get('min_value')}..{f.get('max_value')})"
        if f.get("hint"):
            text += f". {f['hint']}"
        lines.append(text)
    return "\n".join(lines)


def _ingest_record(ingest_metrics: Path, dataset: str) -> Any:
    """``metrics/ingest.json`` when it is this dataset's (it is one file: the last ingest may
    have been another dataset's), else None."""
    try:
        recorded = json.loads(ingest_metrics.read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) and recorded.get("dataset") == dataset else None


DROPPED_BY_INGEST = {
    "interactions": "interactions_below_min_rating",
    "items": "duplicate_item_rows_dropped",
}
"""The ingest note that counts a table's source rows dropped before its raw table."""


def rows_are(ingest_metrics: Path, table: str, dataset: str) -> str:
    """What a failure's row numbers count in ``table``: the CSV source file's data rows when
    the raw table holds them one for one, else the raw table's rows, saying why."""
    recorded = _ingest_record(ingest_metrics, dataset)
    try:
        source, notes = recorded["source"], recorded.get("notes") or {}
    except (KeyError, TypeError, AttributeError):
        return "0 = the raw table's first row"
    dropped = int(notes.get(DROPPED_BY_INGEST[table]) or 0)
    if source == "csv" and not dropped:
        return "0 = the first data row"
    if dropped:
        return (
            f"0 = the raw table's first row; ingest dropped {dropped} source row(s) before "
            "it, so these are not the source file's rows"
        )
    return f"0 = the raw table's first row, as ingest built it from the {source} source"


def _provenance(raw: Path, ingest_metrics: Path, table: str, dataset: str) -> str:
    """``data/raw/<ds>/x.parquet (from <source file>)`` when ingest recorded its source for
    this dataset (``metrics/ingest.json`` is one file: the last ingest may be another one's)."""
    try:
        sources = _ingest_record(ingest_metrics, dataset)["sources"][table]
    except (KeyError, TypeError):
        sources = None
    return f"{raw} (from {', '.join(sources)})" if sources else str(raw)


class LoadDrift(NamedTuple):
    report: dict[str, Any]
    """``metrics/drift.json``: this load against ``baseline`` (``models.drift.compare_loads``)."""
    profile: LoadProfile
    """This load's profile, kept when the load is accepted."""
    baseline: LoadProfile | None
    """The profile it was compared with (None: the first load), kept as the previous one."""
    accepted: bool
    """This very load was accepted before (validate re-run on the same raw tables): its drift
    is reported again but stops nothing, however ``validate.fail_on_drift`` is set now."""


def load_drift(settings: Settings, inter: pd.DataFrame, items: pd.DataFrame) -> LoadDrift:
    """This load's drift report against the last accepted load.

    When this is that same load again (validate re-run on unchanged raw tables, after a code or
    parameter change), the baseline is the load before it, so the re-run reproduces the report
    instead of comparing the load with itself."""
    paths = settings.paths
    load_id = fingerprint([paths.raw("interactions"), paths.raw("items")])
    now = profile_load(inter, items, load_id=load_id)
    kept, earlier = read_profiles(profiles=paths.load_profiles, summaries=paths.load_summaries)
    accepted = kept is not None and kept.load_id == load_id
    baseline = earlier if accepted else kept
    report = compare_loads(baseline, now, psi_threshold=settings.validate_.drift_psi)
    report = {"dataset": settings.project.dataset, **report, "accepted_before": accepted}
    return LoadDrift(report, now, baseline, accepted)


def validate(settings: Settings) -> StageResult:
    cfg = settings.validate_
    paths = settings.paths
    frames = {t: read_raw(paths.raw(t)) for t in ("interactions", "items")}
    dataset = settings.project.dataset
    files = {t: _provenance(paths.raw(t), paths.metrics("ingest"), t, dataset) for t in frames}
    checked, failures = run_expectations(frames, cfg)
    stats: dict[str, Any] = {}
    drift: LoadDrift | None = None
    if not failures:
        inter, users_dropped = filter_users(frames["interactions"], cfg.min_user_interactions)
        stats = {
            "users": int(inter["user_id"].nunique()),
            "items": len(frames["items"]),
            "interactions": len(inter),
            "users_below_min_interactions": users_dropped,
            "interactions_dropped": len(frames["interactions"]) - len(inter),
            "min_user_interactions": cfg.min_user_interactions,
        }
        if inter.empty:
            failures.append(
                {
                    "table": "interactions",
                    "expectation": "min_user_interactions",
                    "column": "user_id",
                    "unexpected_count": len(frames["interactions"]),  # every row is dropped
                    "rows_checked": len(frames["interactions"]),
                    "sample_values": [],
                    "sample_rows": [],
                    "hint": f"no user has at least {cfg.min_user_interactions} interactions "
                    f"(validate.min_user_interactions; all {users_dropped} users are below), "
                    "so nothing is left to train on",
                }
            )
        else:
            drift = load_drift(settings, inter, frames["items"])
            if cfg.fail_on_drift and drift.report["flagged"] and not drift.accepted:
                failures.append(_drift_failure(drift.report, cfg.drift_psi))
    report = {
        "dataset": settings.project.dataset,
        "success": not failures,
        "expectations_checked": checked,
        "failures": failures,
        "files": files,
        **stats,
    }
    if drift is not None:
        report["drift"] = {"status": drift.report["status"], "flagged": drift.report["flagged"]}
    metrics_path = paths.metrics("validation")
    if failures:
        with AtomicOutputs() as out:
            out.json(report, metrics_path)
            if drift is not None:  # the drift report that stopped the run
                out.json(drift.report, paths.metrics("drift"))
        counted = {t: rows_are(paths.metrics("ingest"), t, dataset) for t in frames}
        raise ValidationFailed(summarize(dataset, files, failures, counted), report)
    assert drift is not None
    outputs = _write_accepted(paths, inter, frames["items"], report, drift)
    log.info(
        "validation passed: %d checks; %d users dropped below %d interactions; drift: %s",
        checked,
        users_dropped,
        cfg.min_user_interactions,
        drift_line(drift.report),
    )
    summary = f"{dataset_line(report)} · {drift_line(drift.report)}"
    return StageResult.from_files("validate", outputs, report, summary)


def _write_accepted(
    paths: DatasetPaths,
    inter: pd.DataFrame,
    items: pd.DataFrame,
    report: dict[str, Any],
    drift: LoadDrift,
) -> list[Path]:
    """The validated tables, both reports and the kept load profiles, all or nothing."""
    outputs = [paths.validated("interactions"), paths.validated("items")]
    outputs += [paths.metrics("validation"), paths.metrics("drift")]
    with AtomicOutputs() as out:
        out.parquet(inter, outputs[0], INTERACTIONS)
        out.parquet(items, outputs[1], ITEMS)
        out.json(report, outputs[2])
        out.json(drift.report, outputs[3])
        write_profiles(
            out,
            profiles=paths.load_profiles,
            summaries=paths.load_summaries,
            current=drift.profile,
            previous=drift.baseline,
        )
    return [*outputs, paths.load_profiles, paths.load_summaries]


def _drift_failure(drift: dict[str, Any], threshold: float) -> dict[str, Any]:
    """A failed check for ``validate.fail_on_drift``: the flagged distributions and their PSI."""
    psis = {name: drift["distributions"][name]["psi"] for name in drift["flagged"]}
    return {
        "table": "interactions",
        "expectation": "drift_against_last_load",
        "column": None,
        "observed": psis,
        "hint": f"PSI above validate.drift_psi={threshold:g} against load "
        f"{drift['baseline']['load_id']} (metrics/drift.json); if the change is expected, "
        "run once with validate.fail_on_drift=false to accept this load as the new baseline",
    }


def report_markdown(report: dict[str, Any], summary: str | None = None) -> str:
    status = "passed" if report["success"] else "FAILED"
    lines = [
        f"# Validation of `{report['dataset']}`: {status}",
        "",
        f"{report['expectations_checked']} expectations checked.",
        "",
    ]
    if summary:
        lines += ["```", summary, "```"]
    else:
        lines += [
            f"- {k}: {report[k]}"
            for k in ("users", "items", "interactions", "users_below_min_interactions")
        ]
    return "\n".join(lines)


def publish_drift(settings: Settings) -> None:
    """The drift report this run wrote (``metrics/drift.json``) as a markdown artifact."""
    dataset = settings.project.dataset
    drift = read_json(settings.paths.metrics("drift"), "drift report", "run `sidrec validate`")
    publish_markdown(
        "drift-report",
        dataset,
        drift_markdown(drift, dataset),
        description=f"{dataset}: this load against the last accepted one ({drift['status']})",
    )


@task(name="validate", cache_policy=StageCache(stage="validate"), persist_result=True)
def validate_task(settings: Settings) -> StageResult:
    dataset = settings.project.dataset
    try:
        result = validate(settings)
    except ValidationFailed as exc:
        publish_markdown(
            "validation-report", dataset, report_markdown(exc.report, str(exc)), "Validation failed"
        )
        if "drift" in exc.report:
            publish_drift(settings)
        raise
    publish_markdown(
        "validation-report", dataset, report_markdown(result.metrics), "Validation passed"
    )
    publish_drift(settings)
    m = result.metrics
    publish_stats(
        "dataset-stats",
        dataset,
        {k: m[k] for k in ("users", "items", "interactions", "users_below_min_interactions")},
        description=f"{dataset} after validation and the minimum-activity filter",
    )
    return result
