from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.sid import (
    check_sid_map,
    collision_stats,
    parse_sid,
    read_minionerec_index,
    read_sid_map,
    sid_string,
    sid_tokens,
    to_minionerec_index,
)
from sidrec.errors import InputError

MINIONEREC_SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "minionerec-sample"
SAMPLE_INDEX = MINIONEREC_SAMPLE / "index" / "Industrial_and_Scientific.index.json"


def test_token_round_trip():
    assert sid_tokens([12, 3, 7]) == ["<a_12>", "<b_3>", "<c_7>"]
    assert sid_string([12, 3, 7]) == "<a_12><b_3><c_7>"
    assert parse_sid("<a_12><b_3><c_7>") == [12, 3, 7]
    assert parse_sid(["<a_0>", "<b_255>"]) == [0, 255]


@pytest.mark.parametrize("text", ["", "<b_1><a_2>", "<a_1>junk", "<a_x>", "<a_1><c_2>"])
def test_parse_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_sid(text)


def test_collision_stats():
    codes = np.array([[0, 1], [0, 1], [0, 1], [2, 3], [4, 5]])
    assert collision_stats(codes) == (5, 3, 0.4, 3)
    assert collision_stats(codes[3:]).collision_rate == 0.0


def test_real_minionerec_index_imports_and_exports(tmp_path):
    sid_map = read_minionerec_index(SAMPLE_INDEX)
    raw = json.loads(SAMPLE_INDEX.read_text())
    assert len(sid_map) == len(raw) == 283
    assert sid_map["3"] == [224, 163, 184]
    assert to_minionerec_index(sid_map) == raw


def test_check_sid_map_names_collisions_and_lengths(tmp_path):
    with pytest.raises(InputError, match=r"2 items share a SID.*\['x', 'y'\] share <a_1><b_2>"):
        check_sid_map({"x": [1, 2], "y": [1, 2], "z": [1, 3]}, "m.json")
    with pytest.raises(InputError, match="different lengths"):
        check_sid_map({"x": [1, 2], "y": [1]}, "m.json")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"1": [1, 2], "2": [1, 2]}', "share a SID"),
        ('{"1": [1, -2]}', "non-negative integers"),
    ],
)
def test_corrupt_sid_map_is_a_clear_error(tmp_path, content, expected):
    path = tmp_path / "sid_map.json"
    path.write_text(content)
    with pytest.raises(InputError, match=expected):
        read_sid_map(path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"0": ["<a_1>", "<c_2>"]}', "item '0'"),
        ('{"0": 5}', "expected a list of tokens"),
        ('{"0": ["<a_1>"], "1": ["<a_1>", "<b_1>"]}', "different lengths"),
        ("\x00\x01garbage", "not valid JSON"),
    ],
)
def test_corrupt_index_is_a_clear_error(tmp_path, content, expected):
    path = tmp_path / "x.index.json"
    path.write_text(content)
    with pytest.raises(InputError, match=expected):
        read_minionerec_index(path)
