"""Throughput and peak memory of ``manifests.readers.iter_source`` on a generated NeMo JSONL.

    python benchmarks/bench_read.py                 # 1M lines, median of 3 runs
    python benchmarks/bench_read.py --rows 10000000 --repeats 1

Prints rows/s (median) and the process's peak RSS (``resource.getrusage``, which covers
generation too, so the reading run is also measured in a fresh subprocess).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = ("the of and to a in that is was he for it with as his on be at by i this had not are but from or have "
         "an they which one you were her all she there would their we him been has when who will more no if out "
         "so said what up its about into than them can only other new some could time these two may then do first "
         "any my now such like our over man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people mister how too little state good very "
         "make world still own see men work long get here between both life being under never day same another know").split()


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Write ``rows`` NeMo lines: durations ~ lognormal in [0.5, 40] s, ~2.6 words/s of speech."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    with open(path, "w", encoding="utf-8") as fh:
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            dur = np.clip(rng.lognormal(np.log(8.0), 0.6, n), 0.5, 40.0).round(3)
            nwords = np.maximum(1, rng.poisson(dur * 2.6))
            idx = rng.integers(0, len(words), int(nwords.sum()))
            cuts = np.cumsum(nwords)[:-1]
            texts = [" ".join(w) for w in np.split(words[idx], cuts)]
            fh.writelines(
                json.dumps({"audio_filepath": f"audio/{start + i:09d}.flac", "duration": float(d), "text": t,
                            "lang": "en", "pnc": "yes"}) + "\n"
                for i, (d, t) in enumerate(zip(dur, texts))
            )


def read_once(path: Path, chunk_rows: int) -> tuple[int, float]:
    from manifests.readers import iter_source

    t0 = time.perf_counter()
    rows = 0
    for frame in iter_source(path, "nemo", chunk_rows=chunk_rows):
        rows += frame.height
    return rows, time.perf_counter() - t0


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
        rows, secs = read_once(args.child, args.chunk_rows)
        print(json.dumps({"rows": rows, "secs": secs, "peak_rss_mib": peak_rss_mib()}))
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
        print(f"iter_source nemo: {args.rows:,} rows, median {secs:.2f} s over {args.repeats} runs "
              f"= {args.rows / secs:,.0f} rows/s ({size / secs:,.0f} MiB/s)")
        print(f"peak RSS of the reading process: median {rss:,.0f} MiB (chunk_rows={args.chunk_rows:,}, "
              f"file {size:,.0f} MiB)")


if __name__ == "__main__":
    main()
