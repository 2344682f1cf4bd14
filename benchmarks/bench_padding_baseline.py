"""The fixed-batch baseline of `dataprep padding` under three shuffles: token padding.

    python benchmarks/bench_padding_baseline.py               # both corpora, 20 seeds
    python benchmarks/bench_padding_baseline.py --rows 2000 --seeds 2   # a toy run

The fixed 30 s / 40 s schemes batch the rows no longer than L in a shuffled order; only their
token padding depends on the order. Per corpus of ../shared/data (tokens as bench_buckets.py),
prints the mean and standard deviation over seeds of the token padding under: a global shuffle
(``form_batches``, window 1); a scatter to 16 parts in row order, each part shuffled; a
10,000-row shuffle buffer over the manifest's order and over the rows sorted by duration.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_buckets import load  # noqa: E402
from bucketing.batching import Batches, form_batches  # noqa: E402
from bucketing.padding import measure  # noqa: E402

BUDGET = 600.0


def batches_of(order: np.ndarray, size: int) -> Batches:
    """Consecutive batches of ``size`` rows of ``order``."""
    n = order.shape[0]
    offsets = np.append(np.arange(0, n, size), n).astype(np.int64)
    return Batches(bucket=np.zeros(offsets.shape[0] - 1, np.int32), offsets=offsets, rows=order.astype(np.int64))


def scatter(rows: np.ndarray, rng: np.random.Generator, parts: int = 16) -> np.ndarray:
    part = rng.integers(0, parts, rows.shape[0])
    return np.concatenate([r[rng.permutation(r.shape[0])] for r in (rows[part == k] for k in range(parts))])


def shuffle_buffer(rows: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """A shuffle buffer of ``size`` rows: each incoming row replaces a random one, which is
    emitted; the buffer's rest comes out shuffled at the end (a loop over rows: a benchmark)."""
    size = min(size, rows.shape[0])
    buf = rows[:size].copy()
    out = np.empty(rows.shape[0], dtype=np.int64)
    pick = rng.integers(0, size, rows.shape[0] - size) if size else np.zeros(0, np.int64)
    for i, x in enumerate(rows[size:]):
        out[i] = buf[pick[i]]
        buf[pick[i]] = x
    out[rows.shape[0] - size:] = buf[rng.permutation(size)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path,
                    default=Path(os.environ.get("SPEECH_DATAPREP_SHARED_DATA", REPO.parent / "shared" / "data")))
    ap.add_argument("--rows", type=int, default=None, help="Only each corpus's first rows (a toy run).")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--buffer", type=int, default=10_000)
    a = ap.parse_args()
    for name, (d, t) in load(a.data, rows=a.rows).items():
        for length in (30.0, 40.0):
            ok = d <= length
            rows = np.flatnonzero(ok)
            bs = max(1, int(np.floor(BUDGET / length + 1e-9)))
            by_duration = rows[np.argsort(d[rows], kind="stable")]
            figures: dict[str, list[float]] = {"global (today)": [], "scatter 16": [], f"buffer {a.buffer}": [],
                                               f"buffer {a.buffer}, by duration": []}
            for seed in range(a.seeds):
                orders = {f"buffer {a.buffer}": lambda r: shuffle_buffer(rows, r, a.buffer),
                          f"buffer {a.buffer}, by duration": lambda r: shuffle_buffer(by_duration, r, a.buffer),
                          "scatter 16": lambda r: scatter(rows, r)}
                b = form_batches(np.where(ok, 0, -1), np.asarray([bs]), np.random.default_rng([seed, 10]), None,
                                 window=1)
                figures["global (today)"].append(measure(b, d, t, fixed_audio=length).token_padding)
                for k, make in orders.items():
                    order = make(np.random.default_rng([seed, 10]))
                    figures[k].append(measure(batches_of(order, bs), d, t, fixed_audio=length).token_padding)
            print(f"{name} fixed-{length:g}s ({rows.shape[0]:,} rows, batch {bs}), token padding over "
                  f"{a.seeds} seeds:", flush=True)
            for k, v in figures.items():
                sd = statistics.stdev(v) if len(v) > 1 else 0.0
                print(f"  {k:>28}: {100 * statistics.mean(v):6.2f}% +- {100 * sd:.2f}")


if __name__ == "__main__":
    main()
