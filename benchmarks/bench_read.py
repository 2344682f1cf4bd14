"""Throughput and peak memory of ``manifests.readers.iter_source`` on a generated NeMo JSONL.

    python benchmarks/bench_read.py                 # 1M lines, median of 3 runs
    python benchmarks/bench_read.py --rows 10000000 --repeats 1

Prints rows/s (median) and the process's peak RSS (``resource.getrusage``, which covers
generation too, so the reading run is also measured in a fresh subprocess).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Write ``rows`` NeMo lines (see ``bench_compile.generate``: sample_corpus transcripts)."""
    from bench_compile import generate as generate_corpus

    generate_corpus(path, rows, seed=seed)


def read_once(path: Path, chunk_rows: int) -> tuple[int, float, float]:
    from manifests.readers import iter_source

    t0, c0 = time.perf_counter(), time.process_time()
    rows = 0
    for frame in iter_source(path, "nemo", chunk_rows=chunk_rows):
        rows += frame.height
    return rows, time.perf_counter() - t0, time.process_time() - c0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-rows", type=int, default=500_000)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one read in a fresh process: its peak RSS is the reader's alone
        rows, secs, cpu = read_once(args.child, args.chunk_rows)
        print(json.dumps({"rows": rows, "secs": secs, "cpu": cpu, "peak_rss_mib": peak_rss_mib()}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        t0 = time.perf_counter()
        generate(path, args.rows)
        size = path.stat().st_size / 2**20
        print(f"generated {args.rows:,} lines ({size:,.0f} MiB) in {time.perf_counter() - t0:.1f} s")
        results = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, __file__, "--child", str(path), "--chunk-rows", str(args.chunk_rows)],
                                 check=True, capture_output=True, text=True)
            results.append(json.loads(out.stdout))
            assert results[-1]["rows"] == args.rows
        secs = statistics.median(r["secs"] for r in results)
        rss = statistics.median(r["peak_rss_mib"] for r in results)
        cpu = statistics.median(r["cpu"] for r in results)
        print(f"iter_source nemo: {args.rows:,} rows, median {secs:.2f} s over {args.repeats} runs "
              f"= {args.rows / secs:,.0f} rows/s ({size / secs:,.0f} MiB/s); CPU {cpu:.2f} s "
              f"= {args.rows / cpu:,.0f} rows per CPU-second; load average {os.getloadavg()[0]:.1f}")
        print(f"peak RSS of the reading process: median {rss:,.0f} MiB (chunk_rows={args.chunk_rows:,}, "
              f"file {size:,.0f} MiB)")


if __name__ == "__main__":
    main()
