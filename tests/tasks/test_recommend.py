"""Recommendations from the registered champion: the functions, `sidrec recommend`, the batch
flow, and (slow) `mlflow models serve` on `models:/<name>@champion`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sidrec.cli import app
from sidrec.config import Settings
from sidrec.errors import InputError
from sidrec.io import read_table
from sidrec.registry import load_champion
from tasks.recommend import (
    RECOMMENDATIONS,
    recommend,
    recommend_all,
    user_histories,
    write_recommendations,
)
from tasks.register import register

MODEL = "sidrec-recommend-test"
runner = CliRunner()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, make_project, tiny_project) -> Iterator[Path]:
    """One tiny project (cwd for the module) whose model is registered as champion."""
    folder = make_project(tmp_path_factory.mktemp("recommend"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        settings = tiny_project.settings(folder, register={"model_name": MODEL})
        tiny_project.write(settings)
        tiny_project.evaluate(settings)
        assert register(settings).metrics["promoted"]
        yield folder


@pytest.fixture
def settings(root: Path, tiny_project) -> Settings:
    return tiny_project.settings(root, register={"model_name": MODEL})


def test_user_histories_are_whole_sequences_in_time_order(settings: Settings, tiny_project) -> None:
    users = tiny_project.users
    histories = user_histories(settings).set_index("user_id")["history"]
    assert {u: list(h) for u, h in histories.items()} == users


def test_recommend_for_a_user_and_for_a_history(settings: Settings, tiny_project) -> None:
    item_ids, titles, users = tiny_project.item_ids, tiny_project.titles, tiny_project.users
    champion = load_champion(settings)
    assert champion.uri == f"models:/{MODEL}@champion" and champion.version == "1"
    served = recommend(settings, user="u1", k=4, champion=champion)
    assert served.unknown_items == [] and not served.fallback
    recs = served.table
    assert list(recs.columns) == ["rank", "item_id", "title", "score"]
    assert recs["rank"].tolist() == [1, 2, 3, 4] and recs["item_id"].is_unique
    assert set(recs["item_id"]) <= set(item_ids)
    assert recs["title"].tolist() == [titles[i] for i in recs["item_id"]]
    assert not set(recs["item_id"]) & set(users["u1"])  # nothing the user already has
    same = recommend(settings, history=users["u1"], k=4, champion=champion).table
    assert same["item_id"].tolist() == recs["item_id"].tolist()


def test_unknown_history_items_are_dropped_and_an_unknown_history_gets_popularity(
    settings: Settings, tiny_project
) -> None:
    from models.baselines.popularity import Popularity
    from tasks.shared.inputs import read_split

    champion = load_champion(settings)
    known = recommend(settings, history=["i1", "i2"], k=4, champion=champion)
    mixed = recommend(settings, history=["zz", "i1", "yy", "i2"], k=4, champion=champion)
    assert mixed.unknown_items == ["zz", "yy"] and not mixed.fallback
    assert mixed.table.equals(known.table)  # the model read the known items only
    unknown = recommend(settings, history=["zz"], k=4, champion=champion)
    assert unknown.unknown_items == ["zz"] and unknown.fallback
    popular = Popularity(item_ids=tiny_project.item_ids).fit(read_split(settings, "train"))
    expected = [tiny_project.item_ids[i] for i in popular.ranking[:4]]
    assert unknown.table["item_id"].tolist() == expected
    empty = recommend(settings, history=[], k=4, champion=champion)
    assert empty.fallback and empty.table["item_id"].tolist() == expected


def test_recommend_errors(settings: Settings, root: Path, tiny_project) -> None:
    users = tiny_project.users
    champion = load_champion(settings)
    with pytest.raises(InputError, match=rf"unknown user 'ghost' \({len(users)} users"):
        recommend(settings, user="ghost", champion=champion)
    with pytest.raises(InputError, match="either a user id or a history"):
        recommend(settings, champion=champion)
    for history in (["i1"], ["unknown"]):  # model rows and fallback rows alike
        with pytest.raises(InputError, match=r"k must be between 1 and the catalog size \d+, got"):
            recommend(settings, history=history, k=10**10, champion=champion)
    other = tiny_project.settings(root, register={"model_name": "never-registered"})
    with pytest.raises(InputError, match="'never-registered' is not registered"):
        load_champion(other)


def test_recommend_all_writes_every_users_top_k(settings: Settings, tiny_project) -> None:
    titles, users = tiny_project.titles, tiny_project.users
    table = recommend_all(settings, k=3, batch_size=2)
    path = write_recommendations(settings, table)
    back = read_table(path, RECOMMENDATIONS, "recommendations")
    assert len(back) == 3 * len(users) and set(back["user_id"]) == set(users)
    for _, rows in back.groupby("user_id"):
        assert rows["rank"].tolist() == [1, 2, 3] and rows["item_id"].is_unique
    assert back["title"].tolist() == [titles[i] for i in back["item_id"]]


def test_recommend_all_gives_what_is_left_unseen(
    settings: Settings, tiny_project, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    catalog = list(tiny_project.titles)
    histories = pd.DataFrame(
        {"user_id": ["saw-all", "saw-most"], "history": [catalog, catalog[:-2]]}
    )
    monkeypatch.setattr("tasks.recommend.user_histories", lambda settings: histories)
    with caplog.at_level("WARNING", logger="tasks.recommend"):
        table = recommend_all(settings, k=3)
    # no row at all for the user who saw everything, the two unseen items for the other
    assert table["user_id"].tolist() == ["saw-most", "saw-most"]
    assert table["rank"].tolist() == [1, 2] and set(table["item_id"]) == set(catalog[-2:])
    assert "2 user(s) got fewer than 3 items" in caplog.text


def test_cli_recommend(root: Path, tiny_project) -> None:
    all_titles = tiny_project.titles
    sets = [
        arg for o in tiny_project.overrides(register={"model_name": MODEL}) for arg in ("--set", o)
    ]
    result = runner.invoke(app, ["recommend", "--user", "u2", "--k", "3", *sets])
    assert result.exit_code == 0, result.output
    titles = [t for t in all_titles.values() if t in result.output]
    assert len(titles) == 3 and f"{MODEL}@champion" in result.output
    result = runner.invoke(app, ["recommend", "--history", "i1,i2", *sets])
    assert result.exit_code == 0 and sum(t in result.output for t in all_titles.values()) == 10
    mixed = runner.invoke(app, ["recommend", "--history", "i1,nope", *sets])
    assert mixed.exit_code == 0 and "does not know: 'nope'" in mixed.output
    unknown = runner.invoke(app, ["recommend", "--history", "nope", *sets])
    assert unknown.exit_code == 0 and "the most popular items" in unknown.output
    both = runner.invoke(app, ["recommend", "--user", "u1", "--history", "i1", *sets])
    assert both.exit_code == 1 and "exactly one of --user" in both.output


@pytest.mark.slow
def test_batch_recommend_flow(
    root: Path, settings: Settings, prefect_harness: None, tiny_project
) -> None:
    users = tiny_project.users
    from flows.batch import batch_recommend

    overrides = tiny_project.overrides(register={"model_name": MODEL})
    path = batch_recommend(config_path=str(root / "params.yaml"), overrides=overrides, k=2)
    table = pd.read_parquet(path)
    assert Path(path) == settings.paths.processed_dir / "recommendations.parquet"
    assert len(table) == 2 * len(users) and list(table.columns) == RECOMMENDATIONS.names


def _post(port: int, body: dict) -> urllib.request.Request:
    return urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )


@pytest.mark.slow
def test_mlflow_models_serve_champion(root: Path, tiny_project, free_port) -> None:
    """`mlflow models serve -m models:/<name>@champion` answers /invocations with top-K titles."""
    titles = tiny_project.titles
    port = free_port()
    mlflow_cli = str(Path(sys.executable).with_name("mlflow"))
    serve = ["models", "serve", "-m", f"models:/{MODEL}@champion", "--env-manager", "local"]
    server = subprocess.Popen(
        [mlflow_cli, *serve, "--host", "127.0.0.1", "--port", str(port)],
        cwd=root,
        # the server runs `uvicorn` from PATH: this environment's
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"server did not come up:\n{server.stdout.read() if server.stdout else ''}"
                    )
                time.sleep(1)
        body = {"dataframe_records": [{"history": ["i1", "i2"]}, {"history": "i5,i4"}]}
        with urllib.request.urlopen(
            _post(port, {**body, "params": {"k": 3}}), timeout=60
        ) as response:
            predictions = json.loads(response.read())["predictions"]
        assert len(predictions) == 2
        for row in predictions:
            assert len(row["item_ids"]) == 3 and len(set(row["item_ids"])) == 3
            assert row["titles"] == [titles[i] for i in row["item_ids"]]
        # a row without history gets the flagged fallback; a bad k is a 400 that says why
        null_row = {"dataframe_records": [{"history": ["i1"]}, {"history": None}]}
        with urllib.request.urlopen(_post(port, null_row), timeout=60) as response:
            fallbacks = [row["fallback"] for row in json.loads(response.read())["predictions"]]
        assert fallbacks == [False, True]
        # unknown ids are dropped and named per row; a row of only unknown ids falls back
        unknown = {"dataframe_records": [{"history": ["i1", "nope", "i2"]}, {"history": ["x"]}]}
        with urllib.request.urlopen(_post(port, unknown), timeout=60) as response:
            known, only_unknown = json.loads(response.read())["predictions"]
        assert known["unknown_items"] == ["nope"] and known["fallback"] is False
        assert not {"i1", "i2"} & set(known["item_ids"])  # the known history stays excluded
        assert only_unknown["unknown_items"] == ["x"] and only_unknown["fallback"] is True
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(_post(port, {**body, "params": {"k": -1}}), timeout=60)
        answer = json.loads(refused.value.read())
        assert refused.value.code == 400 and answer["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "k must be between 1 and the catalog size" in answer["message"]
        assert "Traceback" not in json.dumps(answer)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_serving_bench_measures_the_served_champion(root: Path, tiny_project) -> None:
    """`python -m bench.serving` (docs/benchmarks.md, Serving) against the tiny champion:
    every request answered, the counts it was asked for, unknown ids named."""
    overrides = tiny_project.overrides(register={"model_name": MODEL})
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "bench.serving", "--requests", "8", "--clients", "2"),
            *("--seconds", "2", "--threads", "1"),
            *(a for o in overrides for a in ("--set", o)),
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = {
        cells[0]: cells[1:]
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| requests")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    p50, p99, sent, errors = (float(v) for v in rows["1 user, sequential"][:4])
    assert sent == 8 and errors == 0 and 0 < p50 <= p99
    assert [float(v) for v in rows["64 users, sequential"][2:4]] == [2, 0]
    load = rows["1 user, 2 clients for 2 s"]
    assert float(load[2]) >= 1 and float(load[3]) == 0
    assert f"models:/{MODEL}@champion" in proc.stdout
    assert (
        "unknown history items answered and named, popularity for an unknown-only history: True"
        in proc.stdout
    )
