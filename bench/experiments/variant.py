"""Benchmark: a finished run folder copied, and its stages from ``--start`` re-run with more
settings, so one change is measured on the same split, SIDs and earlier models.

    python -m bench.experiments.variant bench/runs/q/default/seed-0 bench/runs/frontier/seed-0 \\
        --start grpo --set grpo.frontier_prompts=true
    python -m bench.experiments.compare bench/runs/q/default/seed-0 bench/runs/frontier/seed-0 --model grpo
    python -m bench.experiments.compare bench/runs/frontier/seed-0 bench/runs/frontier/seed-0 \\
        --model sft --model-b grpo
    python -m bench.experiments.variant bench/runs/q/default/seed-0 bench/runs/more-sft/seed-0 --register \\
        --start sft --set sft.warm_start=champion --set sft.epochs=2 --set grpo.enabled=false

The source must hold a finished run of :mod:`bench.quality` (its ``bench-run.json`` names the
settings it ran with); the copy re-runs ``--start`` … evaluate with those settings and the
``--set`` overrides after them, and gets its own run record. An existing copy is refused, never
overwritten; a copy whose stages failed has no run record. ``--register`` first runs the
``register`` stage in the copy with the source's own settings, so the model the source kept
becomes the copy's champion (``bench.quality`` folders hold none before; its gate decides
otherwise) and ``sft.warm_start=champion`` continues training from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.common import bench_args, copy_finished, prepared_by, run_stages, write_run_record
from sidrec.errors import SidrecError
from sidrec.stage import STAGES, Stage

LAST: Stage = "evaluate"


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="a finished run folder (bench.quality)")
    parser.add_argument("copy", type=Path, help="the new folder (must not exist)")
    parser.add_argument(
        "--start", required=True, choices=STAGES[1 : STAGES.index(LAST) + 1], help="first stage"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.key=value"
    )
    parser.add_argument(
        "--register",
        action="store_true",
        help="register the source's kept model in the copy first (for sft.warm_start=champion)",
    )


def variant(
    source: Path, copy: Path, start: Stage, overrides: list[str], *, register: bool = False
) -> Path:
    """Copy ``source`` to ``copy`` and run ``start`` … evaluate there with the source's own
    settings plus ``overrides`` (after the ``register`` stage with the source's settings alone
    when ``register``); returns the copy."""
    record = copy_finished(source, copy, needs=STAGES[STAGES.index(start) - 1])
    if register:
        print(f"registering the source's kept model in {copy}", file=sys.stderr, flush=True)
        run_stages(copy, record["overrides"], start="register", until="register")
    settings = [*record["overrides"], *overrides]
    print(f"running the stages {start}..{LAST} in {copy}", file=sys.stderr, flush=True)
    run = run_stages(copy, settings, start=start, until=LAST)
    write_run_record(copy, settings, LAST, run.seconds, prepared_by(record, start))
    return copy


def main() -> None:
    args = bench_args(__doc__, _options)
    try:
        variant(
            args.source.resolve(),
            args.copy.resolve(),
            args.start,
            args.overrides,
            register=args.register,
        )
    except SidrecError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
