from __future__ import annotations

import numpy as np
import pandas as pd

from bench.bursts import step_gaps, table


def _rows(*rows: tuple[str, int]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["user_id", "timestamp"])


def test_gaps_follow_each_users_targets_across_the_splits():
    splits = {
        # u's train targets out of file order (10 then 10 then 70), v's one row
        "train": _rows(("u", 70), ("v", 5), ("u", 10), ("u", 10)),
        "valid": _rows(("v", 5), ("u", 4000)),
        "test": _rows(("u", 4000), ("v", 9000)),
    }
    gaps = step_gaps(splits)
    assert list(gaps) == ["train → train", "train → valid", "valid → test"]
    np.testing.assert_array_equal(gaps["train → train"], [0, 60])  # never across users
    assert sorted(gaps["train → valid"]) == [0, 3930]
    assert sorted(gaps["valid → test"]) == [0, 8995]
    lines = table(gaps).splitlines()
    assert lines[2] == "| train → train | 2 | 50.0% | 100.0% | 100.0% |"
    assert lines[4] == "| valid → test | 2 | 50.0% | 50.0% | 50.0% |"
