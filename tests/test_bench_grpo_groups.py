"""bench.grpo_groups: per GRPO prompt age, what share of the SFT model's beam groups holds the
row's target, a later train target, the valid and the test target (synthetic project)."""

from __future__ import annotations

from bench.grpo_groups import COLUMNS, group_contents, pooled, table
from sidrec.config import Settings
from tasks.shared.inputs import read_split


def test_every_prompt_is_counted_by_its_age_and_the_newest_row_has_no_later_target(
    trained: Settings,
) -> None:
    settings = trained  # groups of max(evaluate.num_beams, grpo.num_generations) beams
    users = read_split(settings, "train")["user_id"].nunique()
    counts = group_contents(settings)
    assert sorted(counts) == list(range(settings.grpo.rows_per_user))
    for c in counts.values():
        assert c["prompts"] == users
        assert all(0 <= c[column] <= users for column in COLUMNS)
    assert counts[0]["a later train target"] == 0  # the newest train row: its future is valid/test
    doubled = pooled([counts, counts])
    assert doubled[1]["prompts"] == 2 * users and doubled[1]["target"] == 2 * counts[1]["target"]
    rows = table(counts)
    assert rows[0].startswith("| prompt age | prompts | target |") and len(rows) == 2 + len(counts)
    assert rows[2].startswith(f"| 0 | {users} | ")
