"""The recommender object and its MLflow pyfunc wrapper, on a random tiny model (fast)."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from models.lm import load_model_dir
from models.pyfunc import (
    GenerationSettings,
    Recommender,
    log_recommender,
    parse_history,
    pip_requirements,
)

GENERATION = GenerationSettings(top_k=5, num_beams=6, max_length=64, max_history=3, batch_size=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def recommender(model_dir: Path, tiny_project) -> Recommender:
    model, tokenizer = load_model_dir(model_dir)
    return Recommender(
        model=model,
        tokenizer=tokenizer,
        sid_map=tiny_project.sid_map,
        catalog=tiny_project.catalog(),
        generation=GENERATION,
    )


def _assert_valid(tiny_project, item_ids: list[str], titles: list[str], k: int) -> None:
    assert len(item_ids) == k and len(set(item_ids)) == k
    assert set(item_ids) <= set(tiny_project.item_ids)
    assert titles == [tiny_project.titles[i] for i in item_ids]


def test_recommend_returns_k_distinct_catalog_items_with_titles(
    recommender: Recommender, tiny_project
) -> None:
    histories = [["i0", "i1"], ["i5"], [], ["i2", "i3", "i4", "i6", "i7"]]  # more than 2 per batch
    recs = recommender.recommend(histories)
    assert len(recs.item_ids) == len(histories)
    for ids, titles, scores in zip(recs.item_ids, recs.titles, recs.scores, strict=True):
        _assert_valid(tiny_project, ids, titles, GENERATION.top_k)
        assert scores == sorted(scores, reverse=True)
    more = recommender.recommend([["i0"]], k=9)  # above num_beams: the beam widens
    _assert_valid(tiny_project, more.item_ids[0], more.titles[0], 9)


def test_history_is_cut_to_max_history(recommender: Recommender) -> None:
    long = recommender.recommend([["i9", "i8", "i0", "i1", "i2"]], k=3)
    short = recommender.recommend([["i0", "i1", "i2"]], k=3)
    assert long == short


def test_unknown_history_items_are_dropped_and_named(recommender: Recommender) -> None:
    recs = recommender.recommend([["i0"], ["nope", "i1", "x"], ["i1"]])
    assert recs.unknown_items == [[], ["nope", "x"], []]
    assert recs.fallback == [False, False, False]
    assert recs.item_ids[1] == recs.item_ids[2]  # the model read "i1" alone
    for k in (13, 0, -1, 10**10):  # one check for every row, fallback rows too
        for history in (["i0"], []):
            with pytest.raises(
                ValueError, match=f"k must be between 1 and the catalog size 12, got {k}"
            ):
                recommender.recommend([history], k=k)


def test_a_history_with_no_known_item_gets_the_most_popular_items(
    model_dir: Path, tiny_project
) -> None:
    model, tokenizer = load_model_dir(model_dir)
    counts = list(range(len(tiny_project.item_ids)))  # the last catalog item is the most popular
    recommender = Recommender(
        model=model,
        tokenizer=tokenizer,
        sid_map=tiny_project.sid_map,
        catalog=tiny_project.catalog().assign(popularity=counts),
        generation=GENERATION,
    )
    recs = recommender.recommend([["nope"], [], ["i0"]], k=3)
    assert recs.fallback == [True, True, False] and recs.unknown_items == [["nope"], [], []]
    most_popular = tiny_project.item_ids[::-1][:3]
    assert recs.item_ids[0] == recs.item_ids[1] == most_popular
    total = sum(counts) + len(counts)  # add-one shares
    expected = [round(math.log((counts[-1 - r] + 1) / total), 6) for r in range(3)]
    assert recs.scores[0] == pytest.approx(expected)


def test_catalog_items_need_sids(model_dir: Path, tiny_project) -> None:
    model, tokenizer = load_model_dir(model_dir)
    extra = pd.concat(
        [tiny_project.catalog(), pd.DataFrame({"item_id": ["new"], "title": ["New"]})]
    )
    with pytest.raises(ValueError, match=r"1 catalog item\(s\) have no SID"):
        Recommender(
            model=model,
            tokenizer=tokenizer,
            sid_map=tiny_project.sid_map,
            catalog=extra,
            generation=GENERATION,
        )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("i1, i2,i3", ["i1", "i2", "i3"]),
        ("", []),
        (["i1", "i2"], ["i1", "i2"]),
        ([50, 172], ["50", "172"]),
        ([50.0, 172.0], ["50", "172"]),  # JSON clients may send integers as floats
        (pd.Series(["a", "b"]).to_numpy(), ["a", "b"]),
        (None, []),  # a null cell: no history (the popularity fallback)
        (float("nan"), []),
        (pd.NA, []),  # a null in a pandas extension column
    ],
)
def test_parse_history(value: object, expected: list[str]) -> None:
    assert parse_history(value) == expected


@pytest.mark.parametrize("value", [3.5, 7, [1.5], [None], {"a": 1}])
def test_parse_history_rejects_other_types(value: object) -> None:
    with pytest.raises(ValueError, match="history row 4"):
        parse_history(value, row=4)


def test_requirements_are_pinned_without_local_build_tags() -> None:
    pins = dict(p.split("==") for p in pip_requirements())
    assert {"mlflow", "torch", "transformers", "pandas"} <= set(pins)
    assert all(v and "+" not in v for v in pins.values())


def test_logged_model_loads_and_predicts(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_project
) -> None:
    monkeypatch.chdir(tmp_path)
    sid_map = tmp_path / "sid_map.json"
    sid_map.write_text(pd.Series(tiny_project.sid_map).to_json())
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    mlflow.set_experiment("pyfunc-test")
    with mlflow.start_run():
        info = log_recommender(
            name="recommender",
            model_dir=model_dir,
            sid_map=sid_map,
            catalog=tiny_project.catalog(),
            generation=GENERATION,
            example_history=["i0", "i1"],
        )
    loaded = mlflow.pyfunc.load_model(info.model_uri)
    meta = loaded.metadata
    assert meta.get_input_schema().input_names() == ["history"]
    assert meta.get_params_schema().to_dict()[0]["default"] == GENERATION.top_k
    local = Path(mlflow.artifacts.download_artifacts(info.model_uri))
    assert (local / "code" / "models" / "pyfunc.py").exists()  # the served model's own code
    assert (local / "code" / "sidrec" / "errors.py").exists()
    assert "transformers==" in (local / "requirements.txt").read_text()
    frame = pd.DataFrame({"history": [["i0", "i1"], "i5, i4", []]})
    out = loaded.predict(frame)
    assert list(out.columns) == ["item_ids", "titles", "scores", "unknown_items", "fallback"]
    assert len(out) == 3 and out["fallback"].tolist() == [False, False, True]
    for ids, titles in zip(out["item_ids"], out["titles"], strict=True):
        _assert_valid(tiny_project, list(ids), list(titles), GENERATION.top_k)
    assert len(loaded.predict(frame, params={"k": 2})["item_ids"].iloc[0]) == 2
    served = loaded.predict(pd.DataFrame({"history": [["nope", "i0"]]}))
    assert list(served["unknown_items"].iloc[0]) == ["nope"] and not served["fallback"].iloc[0]
    # a request error is an MlflowException the scoring server answers with 400 and its message
    with pytest.raises(MlflowException, match="history row 1: expected a list") as refused:
        loaded.predict(pd.DataFrame({"history": [["i0"], 7]}))
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"


def test_saved_generation_settings_are_read_with_overrides_and_checked(tmp_path: Path) -> None:
    import json

    path = tmp_path / "generation.json"
    path.write_text(json.dumps({"top_k": 5, "num_beams": 6, "max_length": 64, "max_history": 3}))
    # an older file: the later fields take their defaults; overrides win
    assert GenerationSettings.read(path, num_beams=20) == GenerationSettings(
        top_k=5, num_beams=20, max_length=64, max_history=3, batch_size=16, exclude_history=True
    )
    path.write_text(json.dumps({**GENERATION._asdict(), "temperature": 0.7}))
    with pytest.raises(ValueError, match=r"unknown \['temperature'\], missing \[\]"):
        GenerationSettings.read(path)  # a newer sidrec's setting this code would ignore
    path.write_text(json.dumps({"top_k": 5, "num_beams": 6}))
    with pytest.raises(ValueError, match=r"missing \['max_length', 'max_history'\]"):
        GenerationSettings.read(path)
