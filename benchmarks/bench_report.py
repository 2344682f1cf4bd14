"""Stats / filter benchmark: rows per second of ``compute_stats`` and ``apply_filters``.

    python benchmarks/bench_report.py [--rows 10000000] [--repeats 3]

A synthetic manifest frame (log-normal durations around 6 s, TPS around 12 with a 1% tail
of fast-speech outliers, two languages) held in memory; the figure is the median wall time
over --repeats runs, and rows / s derived from it. File I/O is not included.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import polars as pl

from dataprep.analysis.filters import Thresholds, apply_filters
from dataprep.analysis.stats import compute_stats


def synthetic(rows: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    d = np.clip(rng.lognormal(np.log(6.0), 0.6, rows), 0.2, 60.0)
    rate = rng.normal(12.0, 2.0, rows).clip(3.0, None)
    rate[rng.random(rows) < 0.01] *= 3.0
    tokens = (d * rate).astype(np.int32) + 9
    return pl.DataFrame(
        {"id": pl.int_range(0, rows, eager=True).cast(pl.String), "duration": d, "num_tokens": tokens,
         "tps": tokens / d, "lang": rng.choice(np.array(["en", "de"]), rows)}
    )


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    df = synthetic(args.rows)
    th = Thresholds(max_tps=25, min_duration=0.5, max_duration=40)
    t_stats = timed(lambda: compute_stats(df), args.repeats)
    t_filter = timed(lambda: apply_filters(df, th), args.repeats)
    r = apply_filters(df, th)
    print(f"rows: {args.rows:,}  (median of {args.repeats})")
    print(f"compute_stats: {t_stats:.2f} s  ({args.rows / t_stats / 1e6:.1f} M rows/s)")
    print(f"apply_filters (max_tps 25, duration 0.5-40 s): {t_filter:.2f} s  ({args.rows / t_filter / 1e6:.1f} M rows/s);"
          f" kept {r.kept.height:,}, rejected {r.rejected.height:,}")


if __name__ == "__main__":
    main()
