"""Benchmark: the pipeline on synthetic catalogs of 10^5 and 10^6 items, 2 CPU cores (issue 15).

    python -m bench.scale                         # full scale: 10^7 interactions, 10^5 and 10^6 items
    python -m bench.scale --items 10000 --interactions 100000   # a few minutes
    python -m bench.scale --steps data --items 10000 --interactions 1000000 --users 6040 \
        --max-history 200                 # MovieLens-1M's shape at the SASRec/HSTU protocol

Each step runs the real stage or model code in a fresh Python process pinned to ``--threads``
cores, so its time and peak memory (the process's peak RSS, interpreter and imports included)
are its own:

- ``data``: ingest → validate → split (``tasks.*``) of a ``csv`` source holding a power-law
  log of ``--interactions`` rows of ``--users`` users over ``--data-items`` items
  (``bench/synthetic.py``), histories up to ``--max-history`` items (``split.max_history``),
  then the three split files read back as every reader of the split reads them
  (``read_split``: ``read_table`` against ``SPLIT``);
- ``sids``: the sids stage, RQ-KMeans (faiss) on text embeddings (clustered random vectors,
  dim 384, with their manifest), collisions resolved;
- ``rqvae``: the same stage with RQ-VAE for whole epochs of about ``--rqvae-steps`` optimizer
  steps, reported with its extrapolation to ``sids.rqvae.epochs`` (no target);
- ``trie``: ``read_sid_map`` + ``SidTrie.from_sid_map``, as evaluation builds it, on the map
  of the sids step (uniform random distinct SIDs where that step has not run);
- ``decode``: ``SidRecommender.rank`` (constrained beam search, the history excluded) with
  the default tiny model (random weights) for 8 histories × 20 beams, at 1,682 items (random
  SIDs, MovieLens-100k's size) and at each size; a decode step is the median call over its
  L + 1 generation steps (forward, logits processor and per-call exclusion tables).

Synthetic inputs are written once per ``--workdir`` (default ``bench/runs/scale``) and reused.
Prints one markdown table, the target beside each measurement. Targets (issue 15): sids on
10^6 items <= 10 minutes and <= 8 GB with 0 collisions; the trie <= 1 GB at 10^6 items; the
decode step at 10^6 items <= 2x the step at 1,682; ingest + validate + split of 10^7
interactions <= 5 minutes and <= 8 GB.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import REPO, bench_args, folder_settings
from sidrec.config import Settings

STEPS = ("data", "sids", "rqvae", "trie", "decode")
DATA_STAGES = ("ingest", "validate", "split")
SPLIT_NAMES = ("train", "valid", "test")
MOVIELENS_ITEMS = 1682
HISTORIES, HISTORY_LENGTH = 8, 20
TARGET_ITEMS, TARGET_ROWS = 1_000_000, 10_000_000
SIDS_SECONDS, DATA_SECONDS, MEMORY_GB, TRIE_GB, DECODE_RATIO = 600, 300, 8.0, 1.0, 2.0
RESULT = "bench-scale-result: "
"""A worker's last stdout line: this prefix, then its measurement as JSON."""

Worker = Callable[[dict[str, Any], Path], dict[str, Any]]


class Row(NamedTuple):
    """One line of the table."""

    step: str
    scale: str
    time: str
    memory: str
    target: str = ""
    status: str = ""
    notes: str = ""


# --- the steps, as each worker process runs them


def data_settings(work: Path, max_history: int | None = None) -> Settings:
    source = work / "source"
    overrides = [
        "project.dataset=scale-log",
        "ingest.source=csv",
        f"ingest.interactions={source / 'interactions.csv'}",
        f"ingest.items={source / 'items.csv'}",
    ]
    if max_history is not None:
        overrides.append(f"split.max_history={max_history}")
    return folder_settings(work, overrides)


def catalog_settings(work: Path, n_items: int, overrides: list[str] | None = None) -> Settings:
    """The sids stage on the synthetic catalog of ``n_items`` (RQ-KMeans on text by default)."""
    base = ["sids.method=rqkmeans", "sids.embedding=text"]
    return folder_settings(work, [f"project.dataset=scale-{n_items}", *base, *(overrides or [])])


def run_data_stage(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    stage = spec["stage"]
    stage_fn = getattr(importlib.import_module(f"tasks.{stage}"), stage)
    settings = data_settings(work, spec.get("max_history"))
    started = time.perf_counter()
    metrics = stage_fn(settings).metrics
    seconds = time.perf_counter() - started
    if stage == "split":
        facts = {name: metrics[name]["rows"] for name in SPLIT_NAMES}
        files = sum(settings.paths.split(name).stat().st_size for name in SPLIT_NAMES)
        facts["MB on disk"] = round(files / 1e6)
    else:
        facts = {k: metrics[k] for k in ("users", "items", "interactions")}
    return {"seconds": seconds, "facts": facts}


def run_read_split(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """The three split files as every reader gets them (``read_split``'s ``read_table``)."""
    from sidrec.io import read_table
    from sidrec.schemas import SPLIT

    paths = data_settings(work).paths
    started = time.perf_counter()
    splits = [read_table(paths.split(name), SPLIT, f"{name} split") for name in SPLIT_NAMES]
    seconds = time.perf_counter() - started
    entries = sum(int(df["history"].map(len).sum()) for df in splits)
    return {"seconds": seconds, "facts": {"history entries": entries}}


def run_sids(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    from tasks.sids import sids

    settings = catalog_settings(work, spec["items"], spec["overrides"])
    started = time.perf_counter()
    metrics = sids(settings).metrics
    return {"seconds": time.perf_counter() - started, "facts": metrics}


def tiny_tokenizer(settings: Settings, levels: int, codebook_size: int) -> Any:
    """A tokenizer trained on prompt and title text, with the SID tokens (as sft builds one)."""
    from bench.synthetic import catalog
    from models.lm import add_sid_tokens, train_tokenizer
    from models.prompts import seq_rec_prompt

    titles = catalog(5_000).column("title").to_pylist()
    texts = [seq_rec_prompt([]), *titles]
    tokenizer = train_tokenizer(texts, settings.model.tiny.vocab_size)
    add_sid_tokens(tokenizer, levels, codebook_size)
    return tokenizer


def run_trie(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    from models.sid import read_sid_map
    from models.sid_trie import SidTrie

    started = time.perf_counter()
    sid_map = read_sid_map(Path(spec["path"]))
    load_seconds = time.perf_counter() - started
    tokenizer = tiny_tokenizer(folder_settings(work), spec["levels"], spec["codebook_size"])
    before = _rss()
    _reset_peak()
    started = time.perf_counter()
    trie = SidTrie.from_sid_map(sid_map, tokenizer)
    seconds = time.perf_counter() - started
    facts = {"tables": trie.nbytes, "growth": _peak() - before, "load_seconds": load_seconds}
    return {"seconds": seconds, "facts": facts}


def run_decode(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    import numpy as np
    import torch

    from models.lm import build_tiny
    from models.prompts import set_prompt_format
    from models.recommender import SidRecommender
    from models.sid import read_sid_map

    settings = folder_settings(work)
    sid_map = read_sid_map(Path(spec["path"]))
    tokenizer = tiny_tokenizer(settings, spec["levels"], spec["codebook_size"])
    tiny = settings.model.tiny
    model = build_tiny(
        tokenizer,
        **tiny.model_dump(exclude={"vocab_size"}),
        max_length=settings.model.max_length,
        seed=settings.project.seed,
    ).eval()
    set_prompt_format(model, "sequence" if settings.sft.objective == "sequence" else "text")
    started = time.perf_counter()
    recommender = SidRecommender(
        model=model,
        tokenizer=tokenizer,
        sid_map=sid_map,
        item_ids=list(sid_map),
        max_length=settings.model.max_length,
        num_beams=settings.evaluate.num_beams,
        max_history=settings.split.max_history,
        batch_size=settings.evaluate.batch_size,
    )
    build_seconds = time.perf_counter() - started
    rng = np.random.default_rng(0)
    ids = recommender.item_ids
    rows = [rng.choice(len(ids), HISTORY_LENGTH, replace=False) for _ in range(HISTORIES)]
    histories = [[ids[i] for i in r] for r in rows]
    k = settings.evaluate.num_beams

    def rank() -> None:
        recommender.rank(histories, k, exclude=histories)

    call = median_seconds(rank, spec["repeats"])
    with torch.no_grad():
        processor = processor_seconds(recommender, histories, [r.tolist() for r in rows])
    steps = recommender.trie.levels + 1
    facts = {"call": call, "steps": steps, "build_seconds": build_seconds, **processor}
    return {"seconds": call / steps, "facts": facts}


def processor_seconds(
    recommender: Any, histories: list[list[str]], rows: list[list[int]]
) -> dict[str, float]:
    """The logits processor at one step (each beam one SID token in) and the per-call
    exclusion tables, as ``generate_sids`` builds them (median seconds)."""
    import torch

    from models.constrained import SidConstrainedLogitsProcessor, left_pad
    from models.metrics import exclusion_mask

    trie, tokenizer = recommender.trie, recommender.tokenizer
    beams = recommender.num_beams

    def tables() -> torch.Tensor:
        return trie.banned_nodes(exclusion_mask(rows, len(rows), trie.n_items))

    prompts = [recommender.prompts.history_prompt(h) for h in histories]
    ids = left_pad(tokenizer(prompts)["input_ids"], tokenizer.pad_token_id)["input_ids"]
    first = trie.sid_token_ids[torch.randint(trie.n_items, (len(ids) * beams,)), :1]
    ids = torch.cat([ids.repeat_interleave(beams, 0), first], dim=1)
    processor = SidConstrainedLogitsProcessor(
        trie=trie, eos_token_id=tokenizer.eos_token_id, banned_nodes=tables()
    )
    scores = torch.randn(len(ids), len(tokenizer)).log_softmax(-1)

    def step() -> None:
        processor(ids, scores)  # in place, as in beam search; its cost does not depend on values

    return {"processor": median_seconds(step, 20), "tables": median_seconds(tables, 20)}


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    times = []
    for k in range(warmup + repeats):
        started = time.perf_counter()
        fn()
        if k >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


WORKERS: dict[str, Worker] = {
    "data": run_data_stage,
    "read_split": run_read_split,
    "sids": run_sids,
    "trie": run_trie,
    "decode": run_decode,
}


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak() -> int:
    """Peak RSS in bytes since the process started or :func:`_reset_peak` (Linux VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _reset_peak() -> None:
    """Start the peak over from the current RSS (Linux 4.0+; a no-op where refused, the
    peak then being the process's: an upper bound)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def worker_main(args: argparse.Namespace) -> None:
    """Run one step in this process and print its measurement (the parent reads it)."""
    spec = json.loads(args.worker)
    result = WORKERS[spec["kind"]](spec, Path(spec["work"]))
    result["peak"] = _peak()
    print(RESULT + json.dumps(result, default=str), flush=True)


# --- the parent: inputs, one worker process per step, the table


class SidMap(NamedTuple):
    """The SID map the trie and decode steps read at one catalog size."""

    path: Path
    levels: int
    codebook_size: int
    source: str


def run_worker(spec: dict[str, Any], work: Path, threads: int) -> dict[str, Any] | None:
    """One step in a fresh process; its measurement, or None when it failed (said on stderr)."""
    worker = json.dumps({**spec, "work": str(work)}, default=str)
    command = [sys.executable, "-m", "bench.scale", "--threads", str(threads), "--worker", worker]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # faiss and BLAS
    print(f"[bench.scale] {spec}", file=sys.stderr, flush=True)
    done = subprocess.run(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    lines = done.stdout.splitlines()
    results = [line for line in lines if line.startswith(RESULT)]
    for line in lines:  # stage output meant for the terminal
        if not line.startswith(RESULT):
            print(line, file=sys.stderr)
    if done.returncode != 0 or not results:
        print(f"[bench.scale] FAILED (exit code {done.returncode}): {spec}", file=sys.stderr)
        return None
    measured: dict[str, Any] = json.loads(results[-1].removeprefix(RESULT))
    return measured


def prepare_log(work: Path, n_rows: int, n_items: int, n_users: int | None = None) -> None:
    """The csv source's files, unless the workdir holds them at this size already."""
    from bench.synthetic import write_csv_source

    spec = {"interactions": n_rows, "items": n_items, "users": n_users, "seed": 0}
    record = work / "source" / "spec.json"
    if record.exists() and json.loads(record.read_text()) == spec:
        return
    print(f"[bench.scale] writing {n_rows:,} interactions over {n_items:,} items", file=sys.stderr)
    write_csv_source(work / "source", n_rows, n_items, n_users=n_users)
    record.write_text(json.dumps(spec))


def prepare_catalog(work: Path, n_items: int) -> None:
    """The validated items, embeddings and manifest of the ``n_items`` catalog, unless present."""
    from bench.synthetic import write_embedded_catalog

    paths = catalog_settings(work, n_items).paths
    manifest = paths.item_emb_manifest
    if manifest.exists() and json.loads(manifest.read_text()).get("items") == n_items:
        return
    print(f"[bench.scale] writing a {n_items:,}-item catalog with embeddings", file=sys.stderr)
    write_embedded_catalog(paths, n_items)


def random_map(work: Path, n_items: int) -> SidMap:
    """Distinct uniform random SIDs (L=3, K=256) for ``n_items`` items, written once."""
    from bench.synthetic import random_sid_map

    path = work / "random-sids" / f"{n_items}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(random_sid_map(n_items)))
    return SidMap(path, 3, 256, "random SIDs")


def data_rows(work: Path, args: argparse.Namespace) -> list[Row]:
    prepare_log(work, args.interactions, args.data_items, args.users)
    history = data_settings(work, args.max_history).split.max_history
    scale = f"{args.interactions:,} interactions, {args.data_items:,} items, history ≤ {history}"
    rows: list[Row] = []
    total, peak = 0.0, 0
    for stage in DATA_STAGES:
        spec = {"kind": "data", "stage": stage, "max_history": history}
        measured = run_worker(spec, work, args.threads)
        if measured is None:
            return [*rows, Row(stage, scale, "failed", "", status="FAILED")]
        total += measured["seconds"]
        peak = max(peak, measured["peak"])
        rows.append(measured_row(stage, scale, measured))
    met = total <= DATA_SECONDS and peak <= MEMORY_GB * 1e9
    target = f"≤ {DATA_SECONDS // 60} min and ≤ {MEMORY_GB:g} GB at 10^7 interactions"
    status = judged(met, args.interactions == TARGET_ROWS, "10^7 interactions")
    rows.append(Row("data stages", scale, duration(total), gb(peak), target, status, "sum, max"))
    measured = run_worker({"kind": "read_split"}, work, args.threads)
    if measured is None:
        return [*rows, Row("read split", scale, "failed", "", status="FAILED")]
    return [*rows, measured_row("read split", scale, measured)]


def measured_row(step: str, scale: str, measured: dict[str, Any]) -> Row:
    facts = ", ".join(f"{k} {v:,}" for k, v in measured["facts"].items())
    return Row(step, scale, duration(measured["seconds"]), gb(measured["peak"]), notes=facts)


def sids_row(work: Path, n_items: int, args: argparse.Namespace) -> tuple[Row, SidMap | None]:
    measured = run_worker({"kind": "sids", "items": n_items, "overrides": []}, work, args.threads)
    scale = f"{n_items:,} items"
    target = f"≤ {SIDS_SECONDS // 60} min, ≤ {MEMORY_GB:g} GB, 0 collisions at 10^6 items"
    if measured is None:
        return Row("sids rqkmeans", scale, "failed", "", target, "FAILED"), None
    m = measured["facts"]
    met = (
        measured["seconds"] <= SIDS_SECONDS
        and measured["peak"] <= MEMORY_GB * 1e9
        and m["collision_rate_after"] == 0
    )
    notes = (
        f"collisions {m['collision_rate_before']:.4f} → {m['collision_rate_after']:.4f} "
        f"(largest group {m['largest_collision_group']}, {m['reassigned_last_level']:,} moved, "
        f"extra level {m['extra_level']}); k-means {m['train_seconds']:.0f} s"
    )
    status = judged(met, n_items == TARGET_ITEMS, "10^6 items")
    row = Row("sids rqkmeans", scale, duration(measured["seconds"]), gb(measured["peak"]))
    sid_map = SidMap(
        catalog_settings(work, n_items).paths.sid_map,
        m["levels"],
        m["codebook_size"],
        "the sids step's SIDs",
    )
    return row._replace(target=target, status=status, notes=notes), sid_map


def rqvae_row(work: Path, n_items: int, args: argparse.Namespace) -> Row:
    settings = catalog_settings(work, n_items)
    per_epoch = math.ceil(n_items / settings.sids.rqvae.batch_size)
    epochs = max(1, round(args.rqvae_steps / per_epoch))
    overrides = [
        "sids.method=rqvae",
        f"sids.rqvae.epochs={epochs}",
        f"sids.rqvae.eval_every={epochs}",
    ]
    spec = {"kind": "sids", "items": n_items, "overrides": overrides}
    measured = run_worker(spec, work, args.threads)
    scale = f"{n_items:,} items"
    if measured is None:
        return Row("sids rqvae", scale, "failed", "", status="FAILED")
    m = measured["facts"]
    full = settings.sids.rqvae.epochs
    notes = (
        f"{epochs} epoch(s) = {epochs * per_epoch:,} steps, training {m['train_seconds']:.0f} s; "
        f"{full} epochs ≈ {duration(m['train_seconds'] * full / epochs)}; collisions "
        f"{m['collision_rate_before']:.4f} → {m['collision_rate_after']:.4f}"
    )
    target = f"reported at ~{args.rqvae_steps:,} steps"
    return Row(
        "sids rqvae", scale, duration(measured["seconds"]), gb(measured["peak"]), target, "", notes
    )


def trie_row(work: Path, n_items: int, sid_map: SidMap, args: argparse.Namespace) -> Row:
    spec = {"kind": "trie", **sid_map._asdict()}
    measured = run_worker(spec, work, args.threads)
    scale = f"{n_items:,} items"
    target = f"≤ {TRIE_GB:g} GB at 10^6 items"
    if measured is None:
        return Row("trie", scale, "failed", "", target, "FAILED")
    m = measured["facts"]
    status = judged(m["growth"] <= TRIE_GB * 1e9, n_items == TARGET_ITEMS, "10^6 items")
    notes = (
        f"{sid_map.source}; tables {m['tables'] / 2**20:.1f} MiB; read_sid_map "
        f"{m['load_seconds']:.1f} s; process peak {gb(measured['peak'])}"
    )
    return Row(
        "trie",
        scale,
        duration(measured["seconds"]),
        f"{gb(m['growth'])} (build)",
        target,
        status,
        notes,
    )


def decode_rows(work: Path, maps: dict[int, SidMap], args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    base = None
    for n_items in (MOVIELENS_ITEMS, *args.items):
        sid_map = random_map(work, n_items) if n_items == MOVIELENS_ITEMS else maps[n_items]
        spec = {"kind": "decode", "repeats": args.repeats, **sid_map._asdict()}
        measured = run_worker(spec, work, args.threads)
        scale = f"{n_items:,} items"
        if measured is None:
            rows.append(Row("decode step", scale, "failed", "", status="FAILED"))
            continue
        m, step = measured["facts"], measured["seconds"]
        notes = (
            f"{sid_map.source}; rank() {1000 * m['call']:.0f} ms / {m['steps']} steps; "
            f"processor {1000 * m['processor']:.2f} ms, exclusion tables "
            f"{1000 * m['tables']:.1f} ms per call; recommender built in {m['build_seconds']:.1f} s"
        )
        row = Row("decode step", scale, f"{1000 * step:.1f} ms", gb(measured["peak"]), notes=notes)
        if n_items == MOVIELENS_ITEMS:
            base = step
        elif base is not None:
            ratio = step / base
            target = f"≤ {DECODE_RATIO:g}× the step at 1,682 items, at 10^6 items"
            at_scale = n_items == TARGET_ITEMS
            status = judged(ratio <= DECODE_RATIO, at_scale, "10^6 items", f"{ratio:.2f}×")
            row = row._replace(target=target, status=status)
        rows.append(row)
    return rows


def judged(met: bool, at_target_scale: bool, target_scale: str, value: str = "") -> str:
    """``met`` / ``NOT met``, or a dash where the run is not at the target's scale."""
    shown = f"{value}; " if value else ""
    if not at_target_scale:
        return f"— ({shown}target is for {target_scale})"
    return ("met" if met else "NOT met") + (f" ({value})" if value else "")


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{1000 * seconds:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ({seconds:.0f} s)"
    return f"{seconds / 3600:.1f} h"


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def table(rows: list[Row]) -> str:
    lines = [
        "| step | scale | time | peak memory | target | status | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, nargs="+", default=[100_000, TARGET_ITEMS])
    parser.add_argument("--interactions", type=int, default=TARGET_ROWS)
    parser.add_argument(
        "--users", type=int, help="users of the data stages (default: one per 20 interactions)"
    )
    parser.add_argument(
        "--max-history",
        type=int,
        help="split.max_history of the data stages (default: params.yaml's)",
    )
    parser.add_argument(
        "--data-items", type=int, help="catalog of the data stages (default: the largest --items)"
    )
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--rqvae-steps", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=7, help="timed rank() calls per decode step")
    parser.add_argument("--workdir", type=Path, default=REPO / "bench" / "runs" / "scale")
    parser.add_argument("--worker", help=argparse.SUPPRESS)


def main() -> None:
    args = bench_args(__doc__, options)
    if args.worker:
        pin(args.threads)
        worker_main(args)
        return
    args.data_items = args.data_items or max(args.items)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    rows = data_rows(work, args) if "data" in args.steps else []
    maps: dict[int, SidMap] = {}
    for n_items in args.items:
        if {"sids", "rqvae"} & set(args.steps):
            prepare_catalog(work, n_items)
        if "rqvae" in args.steps:
            rows.append(rqvae_row(work, n_items, args))
        made = sids_row(work, n_items, args) if "sids" in args.steps else None
        if made is not None:
            rows.append(made[0])
        maps[n_items] = made[1] if made and made[1] else random_map(work, n_items)
        if "trie" in args.steps:
            rows.append(trie_row(work, n_items, maps[n_items], args))
    if "decode" in args.steps:
        rows += decode_rows(work, maps, args)
    print(
        f"bench.scale: synthetic data in {work}; {args.threads} cores per step "
        f"(of {os.cpu_count()}); load average {load:.1f} at start; peak memory = the step "
        "process's peak RSS (interpreter and imports included)\n"
    )
    print(table(rows))


def pin(threads: int) -> None:
    """Keep this worker on ``threads`` cores, as on the 2-core target machine."""
    import pyarrow

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) > threads:
        os.sched_setaffinity(0, cores[:threads])
    pyarrow.set_cpu_count(threads)


if __name__ == "__main__":
    main()
