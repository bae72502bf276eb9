"""Benchmark: embedding and SID construction on MovieLens-100k, 2 CPU threads.

    python -m bench.sids            # or: make bench

Runs ingest → validate → embed (cold cache) → sids (RQ-VAE, RQ-KMeans, balanced RQ-KMeans)
in a temporary folder with the repo's params.yaml and prints a markdown table (copied into
the README). Targets (issue 3): collision rate after resolution 0, level-1 codebook usage
>= 90 % of K, RQ-VAE training <= 60 s and embedding <= 60 s on 2 CPU cores.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import bench_args
from sidrec.config import load_settings

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    args = bench_args(__doc__)

    from tasks.embed import embed
    from tasks.ingest import ingest
    from tasks.sids import sids
    from tasks.validate import validate

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = [
            f"project.data_dir={work / 'data'}",
            f"project.metrics_dir={work / 'metrics'}",
            f"embed.cache_dir={work / 'cache'}",
        ]
        settings = load_settings(REPO / "params.yaml", base)
        ingest(settings)
        validate(settings)
        started = time.perf_counter()
        emb = embed(settings).metrics
        embed_seconds = time.perf_counter() - started
        rows = []
        for label, extra in [
            ("rqvae", ["sids.method=rqvae"]),
            ("rqkmeans", ["sids.method=rqkmeans"]),
            ("rqkmeans balanced", ["sids.method=rqkmeans", "sids.rqkmeans.balanced=true"]),
        ]:
            run = load_settings(REPO / "params.yaml", base + extra)
            started = time.perf_counter()
            m = sids(run).metrics
            total = time.perf_counter() - started
            rows.append((label, m, total))

    k = settings.sids.codebook_size
    print(
        f"MovieLens-100k: {emb['items']} items, encoder {emb['encoder']} (dim {emb['dim']}), "
        f"{args.threads} CPU threads, L={settings.sids.levels}, K={k}"
    )
    print(f"embedding (cold cache, incl. model load): {embed_seconds:.1f} s\n")
    print(
        "| method | train s | stage s | collisions before | after | largest group | level-1 usage | perplexity per level | extra level |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, m, total in rows:
        usage = m["level_usage"]
        perplexity = " / ".join(f"{u['perplexity']:.0f}" for u in usage)
        print(
            f"| {label} | {m['train_seconds']:.1f} | {total:.1f} | {m['collision_rate_before']:.4f} | "
            f"{m['collision_rate_after']:.4f} | {m['largest_collision_group']} | {usage[0]['usage']:.1%} | "
            f"{perplexity} | {m['extra_level']} |"
        )


if __name__ == "__main__":
    main()
