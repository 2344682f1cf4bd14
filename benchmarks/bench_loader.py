"""Loader start-up and metadata path on a large plan (default 10M utterances, 8 ranks).

    python benchmarks/bench_loader.py [--utterances 10000000] [--world-size 8] [--work DIR]

Builds (once, kept in --work): a compiled manifest of N utterances whose audio points at a
few real 35 s FLAC files (``write_tone``), buckets (30 x 2, 600 s padded budget) and a plan
made by the real planner (``dataprep.planning.build_plan``, the code of
``dataprep plan-batches``). Then prints medians of:

- time to first batch, metadata only: open rank 0's shard, seek, map the manifest columns
  (warm cache: an Arrow file built once per manifest) and gather the first batch's rows;
- time to first batch with audio: the same plus reading, resampling and log-mel of batch 0;
- metadata path per batch: read ids/rows from the shard + gather manifest rows (no audio).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bucketing.allocate import fit_spec  # noqa: E402
from dataprep.planning import build_plan  # noqa: E402
from dataprep.loader import BatchBuilder, ManifestColumns  # noqa: E402
from dataprep.testing import WORDS, write_tone  # noqa: E402
from dataprep.tokenize import train_model  # noqa: E402
from manifests.buckets_file import write_buckets  # noqa: E402
from manifests.io import write_manifest  # noqa: E402
from manifests.plan_files import PlanShard  # noqa: E402


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
        meta = build_plan(manifest, buckets, plan, world_size=world_size, seed=0, epochs=1)
        print(f"planned {meta['num_steps']:,} steps x {world_size} ranks with the real planner in "
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

    t = time.perf_counter()
    ManifestColumns.open(manifest, cache)
    print(f"manifest column cache (one-time per manifest, or reused): {time.perf_counter() - t:.2f} s")

    meta_first, audio_first = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        shard = PlanShard(plan, 0)
        pb = next(shard.iter_batches(0))
        cols = ManifestColumns.open(manifest, cache)
        cols.gather(pb.rows, pb.ids)
        meta_first.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = BatchBuilder(manifest, [str(spm)], cache_dir=cache)
        batch = b.build(next(PlanShard(plan, 0).iter_batches(0)))
        audio_first.append(time.perf_counter() - t)

    cols = ManifestColumns.open(manifest, cache)
    shard = PlanShard(plan, 0)
    mid = shard.num_steps // 2
    per_batch = []
    it = shard.iter_batches(mid)  # seek to the middle: no earlier row group is read
    chunk = 100
    sizes = []
    for _ in range(max(1, args.batches // chunk)):
        t = time.perf_counter()
        n = 0
        for _ in range(chunk):
            pb = next(it, None)
            if pb is None:
                break
            m = cols.gather(pb.rows, pb.ids)
            sizes.append(len(m.ids))
            n += 1
        if n:
            per_batch.append((time.perf_counter() - t) / n)

    print(f"plan: {args.utterances:,} utterances, world size {args.world_size}, "
          f"{shard.num_steps:,} steps on rank 0, median batch {int(np.median(sizes))} utterances")
    print(f"time to first batch, metadata (open shard + seek + map manifest + gather): "
          f"median {statistics.median(meta_first) * 1e3:.1f} ms (goal <= 500 ms); first in this process "
          f"{meta_first[0] * 1e3:.1f} ms")
    print(f"time to first batch, with audio + log-mel ({batch.size} utts, {batch.features.shape[1]} frames): "
          f"median {statistics.median(audio_first) * 1e3:.1f} ms")
    print(f"metadata path per batch (shard ids/rows + manifest gather, no audio): "
          f"median {statistics.median(per_batch) * 1e3:.3f} ms (goal <= 0.2 ms)")


if __name__ == "__main__":
    main()
