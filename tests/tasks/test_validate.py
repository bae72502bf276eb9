from __future__ import annotations

import json

import pytest

from sidrec.errors import ValidationFailed
from tasks.ingest import ingest
from tasks.validate import filter_users, validate


@pytest.fixture
def ingest_and_validate(project, write_csv_dataset, csv_settings):
    """``ingest_and_validate(interactions=None, items=None, **sections)``: the CSV dataset
    (default: the small valid one) ingested and validated; returns the settings and result."""

    def run(interactions=None, items=None, **extra):
        inter, items_path = write_csv_dataset(project / "src", interactions, items)
        settings = csv_settings(project, inter, items_path, **extra)
        ingest(settings)
        return settings, validate(settings)

    return run


@pytest.fixture
def failure(project, ingest_and_validate):
    """``failure(interactions=None, items=None)``: the validation error and report of a dataset
    that fails, checking that the report says so and nothing validated was written."""

    def run(interactions=None, items=None) -> tuple[ValidationFailed, dict]:
        with pytest.raises(ValidationFailed) as err:
            ingest_and_validate(interactions, items)
        report = json.loads((project / "metrics" / "validation.json").read_text())
        assert report["success"] is False
        assert not (project / "data" / "validated").exists()
        return err.value, report

    return run


def test_valid_dataset_passes_and_writes_validated_tables(ingest_and_validate):
    settings, result = ingest_and_validate()
    m = result.metrics
    assert m["success"] and m["failures"] == []
    assert (m["users"], m["items"], m["interactions"]) == (3, 4, 12)
    assert m["expectations_checked"] >= 20
    assert settings.paths.validated("interactions").exists()
    assert result.outputs_intact()


def test_null_ids_are_reported_with_rows(failure):
    err, report = failure(
        "user_id,item_id,timestamp\n1,a,1600000000\n,b,1600000001\n1,c,1600000002\n"
    )
    (f,) = report["failures"]
    assert (f["table"], f["column"], f["expectation"]) == (
        "interactions",
        "user_id",
        "expect_column_values_to_not_be_null",
    )
    assert f["unexpected_count"] == 1 and f["sample_rows"] == [1]
    assert "interactions.csv" in str(err) and "column 'user_id'" in str(err)
    assert "rows [1] (0 = the first data row)" in str(err)


def test_rows_after_min_rating_are_counted_in_the_raw_table(ingest_and_validate):
    # two low ratings first: the null id is the source's data row 3, the raw table's row 1
    rows = (
        "user_id,item_id,timestamp,rating\n1,a,1600000000,1\n1,b,1600000001,1\n"
        "1,c,1600000002,5\n,d,1600000003,5\n"
    )
    with pytest.raises(ValidationFailed) as err:
        ingest_and_validate(rows, ingest={"min_rating": 3})
    assert err.value.report["failures"][0]["sample_rows"] == [1]
    assert (
        "rows [1] (0 = the raw table's first row; ingest dropped 2 source row(s) before it, "
        "so these are not the source file's rows)"
    ) in str(err.value)


def test_unknown_items_and_far_future_and_duplicates(failure):
    rows = "user_id,item_id,timestamp\n1,a,1600000000\n1,zz,1600000001\n1,b,4102444800\n1,a,1600000000\n"
    err, report = failure(rows)
    by_exp = {f["expectation"]: f for f in report["failures"]}
    assert by_exp["expect_column_values_to_be_in_set"]["sample_values"] == ["zz"]
    assert by_exp["expect_column_values_to_be_between"]["sample_values"] == [4102444800]
    assert by_exp["expect_compound_columns_to_be_unique"]["unexpected_count"] == 2
    assert "4102444800" in str(err)


def test_a_failure_names_the_file_its_own_dataset_came_from(
    project, write_csv_dataset, csv_settings
):
    """metrics/ingest.json holds the last ingest's sources, which may be another dataset's."""
    duplicated = "user_id,item_id,timestamp\n1,a,1600000000\n1,a,1600000000\n1,b,1600000001\n"
    bad = csv_settings(project, *write_csv_dataset(project / "bad", duplicated), dataset="t")
    ingest(bad)
    ingest(csv_settings(project, *write_csv_dataset(project / "good"), dataset="other"))
    with pytest.raises(ValidationFailed) as err:
        validate(bad)
    assert "good" not in str(err.value) and "data/raw/t/interactions.parquet" in str(err.value)
    ingest(bad)
    with pytest.raises(ValidationFailed) as err:
        validate(bad)
    assert f"(from {project / 'bad' / 'interactions.csv'})" in str(err.value)


def test_catalog_problems(failure):
    err, report = failure(items="item_id,title\na,Alpha\na,Other\nb, \nc,Gamma\nd,Delta\n")
    by_exp = {f["expectation"]: f for f in report["failures"]}
    assert by_exp["expect_column_values_to_be_unique"]["sample_values"] == ["a", "a"]
    assert by_exp["expect_column_values_to_not_match_regex"]["column"] == "title"
    assert "items.csv" in str(err)


def test_empty_tables_fail(failure):
    err, report = failure("user_id,item_id,timestamp\n")
    assert report["failures"][0]["expectation"] == "expect_table_row_count_to_be_between"
    assert "observed 0" in str(err)


def test_user_filter_counts_and_nothing_left_fails(failure):
    one_each = "user_id,item_id,timestamp\n1,a,1600000000\n2,b,1600000001\n3,c,1600000002\n"
    err, report = failure(one_each)
    assert report["failures"][0]["expectation"] == "min_user_interactions"
    assert "no user has at least 3 interactions" in str(err)
    assert "all 3 users are below" in str(err) and "3 of 3 row(s) fail" in str(err)


def test_filter_users_counts_dropped():
    import pandas as pd

    df = pd.DataFrame(
        {
            "user_id": ["a", "a", "a", "b"],
            "item_id": ["x", "y", "z", "x"],
            "timestamp": [1, 2, 3, 4],
        }
    )
    kept, dropped = filter_users(df, 3)
    assert kept["user_id"].unique().tolist() == ["a"] and dropped == 1


def test_failure_does_not_replace_previous_validated_tables(
    project, files_under, ingest_and_validate, write_csv_dataset
):
    settings, _ = ingest_and_validate()
    before = files_under("data/validated")
    write_csv_dataset(project / "src", "user_id,item_id,timestamp\n1,a,1600000000\n,b,1600000001\n")
    ingest(settings)
    with pytest.raises(ValidationFailed):
        validate(settings)
    assert files_under("data/validated") == before


# ---------------------------------------------------------------- the drift report of each load

MORE_USERS = "user_id,item_id,timestamp\n" + "".join(
    f"u{u},{item},{1_600_000_000 + 100 * u + k}\n"
    for u in range(1, 6)
    for k, item in enumerate("abcd")
)
"""The default dataset's 3 users x 4 items plus users u4 and u5, alike."""
SKEWED = "user_id,item_id,timestamp\n" + "".join(
    f"u{u},{item},{1_600_000_000 + 100 * u + k}\n"
    for u, n in ((1, 12), (2, 3), (3, 3))
    for k, item in enumerate("abcd" * 3)
    if k < n
)
"""The same users, one of them four times as active as the others."""


def _drift(settings) -> dict:
    return json.loads(settings.paths.metrics("drift").read_text())


def test_each_load_is_compared_with_the_last_accepted_one(project, ingest_and_validate):
    settings, first = ingest_and_validate()
    report = _drift(settings)
    assert report["status"] == "first load" and report["dataset"] == "tiny"
    assert first.metrics["drift"] == {"status": "first load", "flagged": []}
    assert first.summary.endswith("· first load")
    assert {str(settings.paths.metrics("drift")), str(settings.paths.load_profiles)} <= set(
        first.outputs
    )
    first_load = report["load"]["load_id"]

    settings, second = ingest_and_validate(MORE_USERS)
    report = _drift(settings)
    assert report["baseline"]["load_id"] == first_load != report["load"]["load_id"]
    assert (report["users"]["new"], report["users"]["vanished"]) == (2, 0)
    assert report["users"]["new_examples"] == ["u4", "u5"]
    assert report["sizes"]["interactions"] == {
        "before": 12,
        "after": 20,
        "change": pytest.approx(2 / 3),
    }
    # every user as active as before: the same shape
    assert report["status"] == second.metrics["drift"]["status"] == "no drift"

    # the same load validated again (another parameter): compared with the load before it
    # again, not with itself, so the report does not change
    settings, _ = ingest_and_validate(MORE_USERS, validate={"sample_size": 3})
    again = _drift(settings)
    assert again["baseline"]["load_id"] == first_load
    assert again["users"] == report["users"] and again["sizes"] == report["sizes"]


def test_fail_on_drift_stops_the_run_and_keeps_the_baseline(
    project, files_under, ingest_and_validate
):
    settings, _ = ingest_and_validate()
    kept = files_under("data")
    with pytest.raises(ValidationFailed, match="drift_against_last_load") as err:
        ingest_and_validate(SKEWED, validate={"fail_on_drift": True})
    assert "validate.fail_on_drift=false" in str(err.value)
    (failure,) = err.value.report["failures"]
    assert failure["observed"]["interactions_per_user"] > 0.2
    report = _drift(settings)
    assert report["status"] == "drift" and "interactions_per_user" in report["flagged"]
    # nothing validated was replaced and the baseline is still the first load
    assert {p: t for p, t in files_under("data").items() if not p.startswith("data/raw")} == {
        p: t for p, t in kept.items() if not p.startswith("data/raw")
    }
    # without the switch the same load is reported as drift and accepted as the new baseline
    settings, result = ingest_and_validate(SKEWED)
    assert result.metrics["drift"]["status"] == "drift" and "drift (" in result.summary
    assert _drift(settings)["accepted_before"] is False
    # once accepted, validating the same load again (a code or parameter change) reports the
    # same drift and no longer stops on it
    settings, again = ingest_and_validate(SKEWED, validate={"fail_on_drift": True})
    report = _drift(settings)
    assert report["accepted_before"] is True and "interactions_per_user" in report["flagged"]
    assert again.metrics["drift"]["status"] == "drift"


def test_one_new_heavy_user_does_not_stop_the_run(project, ingest_and_validate):
    """60 users, then the same 60 and one more who touched all 40 items: the ordinary users and
    the items' popularity kept their shape, so ``fail_on_drift`` lets the load through."""
    items = [f"i{n}" for n in range(40)]
    catalog = "item_id,title\n" + "".join(f"{i},Title {i}\n" for i in items)

    def log(*, heavy: bool) -> str:
        rows = [
            f"u{u},{items[(u + k) % 40]},{1_600_000_000 + 100 * u + k}"
            for u in range(60)
            for k in range(5 + u % 10)
        ]
        if heavy:
            rows += [f"heavy,{item},{1_600_100_000 + k}" for k, item in enumerate(items)]
        return "user_id,item_id,timestamp\n" + "\n".join(rows) + "\n"

    ingest_and_validate(log(heavy=False), catalog)
    settings, result = ingest_and_validate(
        log(heavy=True), catalog, validate={"fail_on_drift": True}
    )
    report = _drift(settings)
    assert result.metrics["drift"] == {"status": "no drift", "flagged": []}
    assert report["users"]["new_examples"] == ["heavy"]
    for d in report["distributions"].values():
        assert d["psi"] < 0.01 and d["ks"] < 0.02 and not d["drift"]
