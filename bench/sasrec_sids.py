"""Benchmark: SIDs whose collaborative half is SASRec's item embeddings instead of the SVD
factors, on a finished run folder's split, text embeddings and SASRec model.

    python -m bench.sasrec_sids bench/runs/q/default/seed-0 bench/runs/sasrec-sids/seed-0
    python -m bench.compare bench/runs/q/default/seed-0 bench/runs/sasrec-sids/seed-0 --model sft

The copy re-runs ``sids`` with the collaborative factors (``sids.embedding``: ``hybrid`` or
``collaborative``) replaced by the rows of the source's SASRec input/output embedding table (the
``baselines`` stage's model, trained on the train split only), L2-normalized; items without
train interactions keep a zero row, as with the SVD. Then ``sft`` … ``evaluate`` with the
source's settings; SASRec itself is not retrained, so the baseline is the source's. This swaps
one function for the run and is no pipeline setting (``sids`` runs before ``baselines`` in the
pipeline). Three seeds of it are in docs/benchmarks.md ("SIDs from SASRec's item embeddings"):
no test gain, so the pipeline keeps the SVD factors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd

from bench.common import bench_args, copy_finished, prepared_by, run_stages, write_run_record
from models.baselines.sasrec import load_baseline
from models.item_factors import CollaborativeBasis, ItemFactors
from sidrec.config import Settings
from sidrec.errors import SidrecError
from tasks.shared import embeddings

_svd_factors = embeddings.collaborative_factors
"""The pipeline's factors, kept before the swap: they say which items have no train interactions."""


def sasrec_factors(
    settings: Settings, items: pd.DataFrame, basis: CollaborativeBasis | None
) -> ItemFactors:
    """:func:`tasks.shared.embeddings.collaborative_factors` with SASRec's item embeddings as
    the factors (the SVD still tells which items have no train interactions)."""
    svd = _svd_factors(settings, items, basis)
    catalog = items["item_id"].tolist()
    model = load_baseline(settings.paths.sasrec_model, item_ids=catalog)
    table = model.item_emb.weight[1:].detach().numpy().astype(np.float32)
    table[svd.without_interactions] = 0.0
    norms = np.linalg.norm(table, axis=1, keepdims=True)
    factors = np.divide(table, norms, out=np.zeros_like(table), where=norms > 0)
    return ItemFactors(factors, svd.without_interactions, svd.basis)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="a finished run folder (bench.quality)")
    parser.add_argument("copy", type=Path, help="the new folder (must not exist)")


def sasrec_sids(source: Path, copy: Path) -> Path:
    record = copy_finished(source, copy, needs="baselines")
    settings = list(record["overrides"])
    print(f"running sids with SASRec's item embeddings in {copy}", file=sys.stderr, flush=True)
    with mock.patch.object(embeddings, "collaborative_factors", sasrec_factors):
        sids = run_stages(copy, settings, start="sids", until="sids")
    print(f"running the stages sft..evaluate in {copy}", file=sys.stderr, flush=True)
    rest = run_stages(copy, settings, start="sft", until="evaluate")
    # the record's stages before sids ran in the source, and so did baselines (not re-run here)
    seconds = {**sids.seconds, "baselines": record["seconds"]["baselines"], **rest.seconds}
    write_run_record(copy, settings, "evaluate", seconds, prepared_by(record, "sids"))
    return copy


def main() -> None:
    args = bench_args(__doc__, _options)
    try:
        sasrec_sids(args.source.resolve(), args.copy.resolve())
    except SidrecError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
