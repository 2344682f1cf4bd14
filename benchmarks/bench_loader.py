"""Loader start-up and metadata path on a large plan (default 10M utterances, 8 ranks).

    python benchmarks/bench_loader.py [--utterances 10000000] [--world-size 8] [--work DIR]

Builds (once, kept in --work) a compiled manifest of N utterances pointing at a few real 35 s
FLAC files, 30 x 2 buckets (600 s padded budget) and a plan by ``dataprep.planning.build_plan``.
Prints medians of: the one-time column cache build, cold; the time to the first batch, metadata
only (open rank 0's shard, seek, map the columns, gather the rows), in a fresh process and in
this one; the same with audio (read, resample, log-mel of batch 0); the metadata path per batch,
with and without the Python strings the audio reader and tokenizer need; ``dataprep lookup``'s
library call (one rank's step traced to its manifest rows, row cache warm) at random steps.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bucketing.fit_passes import fit_spec
from dataprep.integrations.lookup import lookup_step
from dataprep.training import BatchBuilder, ColumnCache
from manifests.plan_files import PlanShard
from dataprep.planning import PlanOptions, build_plan
from dataprep.testing import WORDS, write_tone
from dataprep.tokenize import train_model
from manifests.buckets_file import write_buckets
from manifests.manifest_write import write_manifest


def build(work: Path, n: int, world_size: int) -> tuple[Path, Path, Path]:
    manifest, buckets, plan, spm = work / "m.parquet", work / "buckets.json", work / "plan", work / "spm.model"
    if not spm.exists():
        train_model([" ".join(WORDS[i:i + 12]) for i in range(0, len(WORDS), 3)], spm, vocab_size=200, threads=1)
    if not manifest.exists():
        t = time.perf_counter()
        files = [str(write_tone(work / "audio" / f"f{i}.flac", 35.0, sample_rate=16000 if i % 2 else 44100, seed=i))
                 for i in range(4)]
        rng = np.random.default_rng(0)
        dur = np.clip(rng.lognormal(np.log(6.0), 0.6, n), 0.5, 35.0).round(2)
        tok = np.maximum(1, np.round(dur * rng.normal(3.0, 0.5, n))).astype(np.int32)
        df = pl.DataFrame({"id": pl.int_range(0, n, eager=True).cast(pl.String).str.zfill(9),
                           "duration": dur, "num_tokens": tok})
        df = df.with_columns(
            pl.lit(None, pl.Float64).alias("offset"),
            pl.Series("audio_path", np.asarray(files)[np.arange(n) % 4]),
            pl.concat_str([pl.lit("the of and to in is"), pl.col("id").str.slice(6, 3)], separator=" ").alias("text"),
            (pl.col("num_tokens") / pl.col("duration")).alias("tps"),
        )
        write_manifest(df, manifest)
        print(f"built manifest of {n:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
    if not (plan / "plan.json").exists():
        t = time.perf_counter()
        m = pl.read_parquet(manifest, columns=["duration", "num_tokens"])
        spec, _ = fit_spec(m["duration"].to_numpy(), m["num_tokens"].to_numpy(), num_buckets=30, num_subbuckets=2,
                           max_duration_budget=600.0)
        write_buckets(spec, buckets)
        meta = build_plan(manifest, buckets, plan, PlanOptions(world_size=world_size, seed=0, epochs=1))
        print(f"planned {meta.num_steps:,} steps x {world_size} ranks with the real planner in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    return manifest, plan, spm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--utterances", type=int, default=10_000_000)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_loader"))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batches", type=int, default=2000)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    manifest, plan, spm = build(args.work, args.utterances, args.world_size)
    cache = args.work / "cache"

    probe = args.work / "cache-build-probe"
    shutil.rmtree(probe, ignore_errors=True)
    t = time.perf_counter()
    ColumnCache.open(manifest, probe)
    build_s = time.perf_counter() - t
    shutil.rmtree(probe, ignore_errors=True)
    ColumnCache.open(manifest, cache)  # the warm cache the rest uses

    fresh = [_fresh_first_batch(manifest, plan, cache) for _ in range(3)]
    meta_first, audio_first = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        pb = next(PlanShard(plan, 0).iter_batches())
        cols = ColumnCache.open(manifest, cache)
        cols.gather(pb.rows, pb.ids)
        meta_first.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = BatchBuilder(manifest, [str(spm)], cache_dir=cache)
        batch = b.build(next(PlanShard(plan, 0).iter_batches()))
        audio_first.append(time.perf_counter() - t)

    cols = ColumnCache.open(manifest, cache)
    shard = PlanShard(plan, 0)
    per_batch, with_strings, sizes = [], [], []
    chunk = 100
    for strings, out in ((False, per_batch), (True, with_strings)):
        # seek to the middle (no earlier row group is read); each pass reads batches no pass read
        it = PlanShard(plan, 0).iter_batches(shard.num_steps // 2 if not strings else shard.num_steps // 4)
        for _ in range(max(1, args.batches // chunk)):
            t = time.perf_counter()
            n = 0
            for _ in range(chunk):
                pb = next(it, None)
                if pb is None:
                    break
                m = cols.gather(pb.rows, pb.ids)
                if strings:
                    m.audio_paths, m.texts, m.langs  # noqa: B018  (materialize)
                sizes.append(len(m))
                n += 1
            if n:
                out.append((time.perf_counter() - t) / n)

    lookup_step(plan, 0, [0], manifest, cache)  # the row cache, built once per manifest
    rng = np.random.default_rng(0)
    lookups = []
    for step in rng.integers(0, shard.num_steps, args.repeats * 3).tolist():
        t = time.perf_counter()
        lookup_step(plan, step, [step % args.world_size], manifest, cache)
        lookups.append(time.perf_counter() - t)

    print(f"plan: {args.utterances:,} utterances, world size {args.world_size}, "
          f"{shard.num_steps:,} steps on rank 0, median batch {int(np.median(sizes))} utterances")
    print(f"manifest column cache build (one-time per manifest content, cold): {build_s:.2f} s")
    print(f"time to first batch, metadata (open shard + seek + map manifest + gather): "
          f"fresh process median {statistics.median(fresh) * 1e3:.1f} ms (goal <= 500 ms); "
          f"warm median {statistics.median(meta_first) * 1e3:.1f} ms")
    print(f"time to first batch, with audio + log-mel ({batch.size} utts, {batch.features.shape[1]} frames): "
          f"median {statistics.median(audio_first) * 1e3:.1f} ms")
    print(f"metadata path per batch (shard ids/rows + manifest gather, no audio): "
          f"median {statistics.median(per_batch) * 1e3:.3f} ms (goal <= 0.2 ms); "
          f"with audio paths, texts, langs as Python strings {statistics.median(with_strings) * 1e3:.3f} ms")
    print(f"lookup of one rank's step (plan + manifest hash checked, shard seek, row cache gather): "
          f"median {statistics.median(lookups) * 1e3:.1f} ms over {len(lookups)} random steps (goal <= 50 ms)")


_FRESH = """
import sys, time
from manifests.column_cache import ColumnCache
from manifests.plan_files import PlanShard
t = time.perf_counter()
pb = next(PlanShard(sys.argv[2], 0).iter_batches())
ColumnCache.open(sys.argv[1], sys.argv[3]).gather(pb.rows, pb.ids)
print(time.perf_counter() - t)
"""


def _fresh_first_batch(manifest: Path, plan: Path, cache: Path) -> float:
    """Seconds to the first batch's metadata in a new Python process (imports not counted)."""
    out = subprocess.run([sys.executable, "-c", _FRESH, str(manifest), str(plan), str(cache)], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return float(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
