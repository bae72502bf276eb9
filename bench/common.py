"""What every benchmark script starts with."""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from collections.abc import Callable

import torch


def bench_args(
    doc: str | None, parser_setup: Callable[[argparse.ArgumentParser], object] | None = None
) -> argparse.Namespace:
    """Parse ``--threads`` (default 2, the target machine) plus script options; set torch threads."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    if parser_setup is not None:
        parser_setup(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    # TRL calls transformers APIs that warn about their v6 renames on every step
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    logging.basicConfig(level=logging.WARNING)
    return args
