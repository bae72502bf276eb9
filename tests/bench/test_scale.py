"""bench/scale.py and its synthetic data (bench/synthetic.py) at tiny sizes: the interaction
log's shape and guarantees, the clustered embeddings, the catalog the sids stage reads, the
steps run in-process, and the table's verdicts (nothing is timed against a target here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.csv as pacsv

from bench.scale import (
    DATA_STAGES,
    Row,
    SidMap,
    catalog_settings,
    data_settings,
    duration,
    judged,
    random_map,
    run_data_stage,
    run_read_split,
    run_sids,
    run_trie,
    table,
)
from bench.synthetic import (
    END,
    MIN_USER_ROWS,
    START,
    catalog,
    clustered_embeddings,
    interaction_log,
    random_sid_map,
    topics,
    write_csv_source,
    write_embedded_catalog,
)
from models.sid import collision_stats
from tasks.shared.embeddings import load_embeddings


def test_interaction_log_is_a_valid_power_law_log():
    log = interaction_log(5_000, 400, seed=1).to_pandas()
    assert len(log) == 5_000 and list(log.columns) == ["user_id", "item_id", "timestamp"]
    assert log["timestamp"].is_monotonic_increasing  # the file is in time order
    assert log["timestamp"].between(START, END).all()
    per_user = log.groupby("user_id").size()
    assert len(per_user) == 5_000 // 20 and per_user.min() >= MIN_USER_ROWS
    assert per_user.max() > 5 * per_user.median()  # a heavy tail of active users
    # strictly increasing times per user make (user, item, timestamp) unique
    assert not log.duplicated(["user_id", "timestamp"]).any()
    counts = log["item_id"].value_counts()
    assert set(counts.index) <= {f"i{i}" for i in range(400)}
    assert counts.iloc[0] > 20 * counts.median()  # popular head, long tail
    assert interaction_log(5_000, 400, seed=1).equals(interaction_log(5_000, 400, seed=1))
    few = interaction_log(5_000, 400, seed=1, n_users=40).to_pandas().groupby("user_id").size()
    assert len(few) == 40 and few.sum() == 5_000 and few.min() >= MIN_USER_ROWS


def test_clustered_embeddings_are_unit_rows_clustered_by_topic():
    n = 2_000
    emb = clustered_embeddings(n, dim=64, seed=0)
    assert emb.shape == (n, 64) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    topic = np.arange(n) % topics(n)
    same = (emb[topic == 0] @ emb[topic == 0].T).mean()
    other = (emb[topic == 0] @ emb[topic == 1].T).mean()
    assert same > other + 0.2


def test_synthetic_inputs_are_what_the_stages_read(tmp_path: Path):
    files = write_csv_source(tmp_path / "src", 600, 50)
    assert pacsv.read_csv(files["items"]).num_rows == 50
    settings = catalog_settings(tmp_path, 300)
    write_embedded_catalog(settings.paths, 300)
    emb = load_embeddings(settings, catalog(300).column("item_id").to_pylist())  # checks manifest
    assert emb.shape == (300, 384)
    sid_map = random_sid_map(1_000, levels=2, codebook_size=40)
    codes = np.array(list(sid_map.values()))
    assert len(sid_map) == 1_000 and codes.max() < 40
    assert collision_stats(codes).collision_rate == 0


def test_the_sids_and_trie_steps_run_the_stage_and_measure_it(tmp_path: Path):
    settings = catalog_settings(tmp_path, 300, ["sids.codebook_size=16"])
    write_embedded_catalog(settings.paths, 300)
    spec = {"items": 300, "overrides": ["sids.codebook_size=16"]}
    made = run_sids(spec, tmp_path)
    assert made["facts"]["collision_rate_after"] == 0 and made["facts"]["items"] == 300
    sid_map = SidMap(settings.paths.sid_map, made["facts"]["levels"], 16, "the sids step's")
    trie = run_trie(sid_map._asdict(), tmp_path)
    assert trie["facts"]["tables"] > 0 and trie["seconds"] >= 0
    random = random_map(tmp_path, 500)
    assert len(json.loads(random.path.read_text())) == 500


def test_the_data_step_splits_at_the_given_history_and_reads_the_split_back(tmp_path: Path):
    write_csv_source(tmp_path / "source", 2_000, 50, n_users=10)  # 200 rows per user
    for stage in DATA_STAGES:
        made = run_data_stage({"stage": stage, "max_history": 120}, tmp_path)
    assert (
        made["facts"]["valid"] == made["facts"]["test"] == 10 and made["facts"]["MB on disk"] >= 0
    )
    read = run_read_split({}, tmp_path)
    train = pd.read_parquet(data_settings(tmp_path).paths.split("train"))
    lengths = train["history"].map(len)
    assert lengths.max() == 120 and read["facts"]["history entries"] > lengths.sum()


def test_verdicts_and_table():
    assert judged(True, True, "10^6 items") == "met"
    assert judged(False, True, "10^6 items", "2.50×") == "NOT met (2.50×)"
    assert judged(True, False, "10^6 items") == "— (target is for 10^6 items)"
    assert [duration(s) for s in (0.0042, 12.34, 250, 9000)] == [
        "4 ms",
        "12.3 s",
        "4.2 min (250 s)",
        "2.5 h",
    ]
    text = table([Row("trie", "1,000 items", "4 ms", "0.01 GB", "≤ 1 GB", "met", "x")])
    assert text.splitlines()[2] == "| trie | 1,000 items | 4 ms | 0.01 GB | ≤ 1 GB | met | x |"
