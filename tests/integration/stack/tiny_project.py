"""The stack test's project, written inside the cpu worker (``docker compose exec cpu-worker
python -m tests.integration.stack.tiny_project data/stack-test``): the benchmark's tiny
generated dataset (30 items, 24 users) and a configuration file, ``<folder>/params.yaml``, that
runs every stage on it in seconds. The browser names that file in the run form, with one
override typed beside it, so the form stays short."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.retrain import tiny_project_overrides
from sidrec.config import load_settings
from sidrec.config.loading import dump_settings

DATASET = "stack-tiny"


def write(folder: Path) -> Path:
    """The dataset under ``folder/src`` and the resolved configuration as ``folder/params.yaml``
    (relative paths: the flow run resolves them against the worker's project folder)."""
    overrides = [*tiny_project_overrides(folder), f"project.dataset={DATASET}"]
    settings = load_settings("params.yaml", overrides)
    config = folder / "params.yaml"
    dump_settings(settings, config)
    load_settings(config)  # the file reads back: a bad key fails here, not in the flow run
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path, help="where the dataset and params.yaml go")
    write(parser.parse_args().folder)


if __name__ == "__main__":
    main()
