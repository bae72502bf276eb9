"""Prefect flows: persisted results and cache keys skip unchanged stages."""

from __future__ import annotations

from flows.data import prepare_data
from tests.conftest import csv_settings, write_csv_dataset


def test_rerun_skips_unchanged_stages_and_repairs_deleted_outputs(project, prefect_harness, files_under):
    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="flowtest")
    first = prepare_data(settings)
    assert {k: first["split"].metrics[k]["rows"] for k in ("train", "valid", "test")} == {"train": 3, "valid": 3, "test": 3}
    before = files_under("data")

    again = prepare_data(settings)
    assert files_under("data") == before  # every task was served from the cache
    assert again["split"].outputs == first["split"].outputs

    settings.paths.split("test").unlink()
    prepare_data(settings)
    after = files_under("data")
    assert settings.paths.split("test").exists()
    changed = {p for p in after if after[p] != before.get(p)}
    assert changed == {str(settings.paths.split(n)) for n in ("train", "valid", "test")}


def test_changing_a_split_param_reruns_only_split(project, prefect_harness, files_under):
    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="flowparam")
    prepare_data(settings)
    before = files_under("data")
    shorter = csv_settings(project, inter, items, dataset="flowparam", split={"max_history": 1})
    result = prepare_data(shorter)
    after = files_under("data")
    changed = {p for p in after if after[p] != before[p]}
    assert changed == {str(shorter.paths.split(n)) for n in ("train", "valid", "test")}
    assert result["split"].metrics["test"]["mean_history"] == 1.0


def test_changed_source_data_reruns_everything(project, prefect_harness):
    inter, items = write_csv_dataset(project / "src")
    settings = csv_settings(project, inter, items, dataset="flowdata")
    prepare_data(settings)
    inter.write_text(inter.read_text() + "u9,a,1600000900\nu9,b,1600000901\nu9,c,1600000902\n")
    result = prepare_data(settings)
    assert result["ingest"].metrics["users"] == 4
    assert result["split"].metrics["test"]["rows"] == 4
