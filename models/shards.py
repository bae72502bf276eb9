"""What one training process trained on, so a multi-process run can show that each process had
its own shard of the data (transformers' and TRL's samplers split every batch by rank)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any


class ShardRecord:
    """Counts the training rows a process consumed and fingerprints its first batch (a digest
    of the rows' token ids): processes that share the data instead of splitting it would show
    the same first batch."""

    def __init__(self) -> None:
        self.rows = 0
        self.first_batch: str | None = None

    def add(self, rows: Sequence[Sequence[int]]) -> None:
        """One batch, as the token ids (or any integer ids) of each row; after the first batch
        only its length is read."""
        if self.first_batch is None:
            digest = hashlib.sha256(repr([list(map(int, r)) for r in rows]).encode())
            self.first_batch = digest.hexdigest()[:16]
        self.rows += len(rows)

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "first_batch": self.first_batch}
