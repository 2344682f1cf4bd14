"""Audio header reads (``dataprep.compile.probe.probe_headers``) on generated WAV/FLAC files: files/s.

    python benchmarks/bench_probe.py                    # 200k files, median of 3 runs
    python benchmarks/bench_probe.py --files 20000 --repeats 5

Writes ``--files`` tiny real audio files (0.1-0.5 s, 16 kHz mono, half WAV half FLAC, with
soundfile, in parallel) under a temporary folder (removed afterwards), then reads every
header with 1 process x 1 thread, 1 process x ``--threads`` threads, 2 processes x
``--threads`` threads, and through Ray Data ``map_batches`` when Ray is installed. Prints the
median files/s, files/s per process (per core) and the 2-process scaling factor.

The files were just written, so they sit in the page cache: this is the header-parsing
and syscall cost on local disk, not cold-disk or network-filesystem latency.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


def _write_files(args: tuple[str, int, int, int]) -> list[str]:
    import soundfile

    root, start, stop, seed = args
    rng = np.random.default_rng(seed)
    sr = 16000
    paths = []
    for k in range(start, stop):
        n = int(sr * rng.uniform(0.1, 0.5))
        t = np.arange(n) / sr
        sig = (0.05 * np.sin(2 * np.pi * 220.0 * t) * (t < 0.05)).astype(np.float32)
        ext = "flac" if k % 2 else "wav"
        folder = Path(root) / f"{k // 1000:04d}"
        folder.mkdir(exist_ok=True)
        path = folder / f"{k:07d}.{ext}"
        soundfile.write(path, sig, sr, subtype="PCM_16")
        paths.append(str(path))
    return paths


def generate(root: Path, files: int, processes: int) -> list[str]:
    """Write ``files`` audio files under ``root`` with ``processes`` processes; their paths in order."""
    step = 2000
    tasks = [(str(root), s, min(s + step, files), s) for s in range(0, files, step)]
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [p for chunk in pool.map(_write_files, tasks) for p in chunk]


def _probe(args: tuple[list[str], int]) -> int:
    from dataprep.compile.probe import probe_headers

    paths, threads = args
    info = probe_headers(paths, threads=threads)
    bad = info["probe_reason"].is_not_null().sum()
    if bad:
        raise RuntimeError(f"{bad} headers could not be read")
    return info.height


def run_processes(pool: ProcessPoolExecutor | None, paths: list[str], processes: int, threads: int) -> float:
    """Seconds to read every header with ``processes`` processes (contiguous slices) x ``threads``."""
    t0 = time.perf_counter()
    if pool is None:
        n = _probe((paths, threads))
    else:
        slices = np.array_split(np.arange(len(paths)), processes * 4)  # a few tasks per process
        n = sum(pool.map(_probe, [([paths[i] for i in s], threads) for s in slices]))
    assert n == len(paths)
    return time.perf_counter() - t0


def run_ray(paths: list[str], threads: int, batch: int) -> list[float] | None:
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)

    def probe_batch(b: dict) -> dict:
        from dataprep.compile.probe import probe_headers

        info = probe_headers(list(b["path"]), threads=threads)
        return {"duration": info["file_duration"].to_numpy()}

    times = []
    try:
        for _ in range(ARGS.repeats):
            t0 = time.perf_counter()
            ds = ray.data.from_items([{"path": p} for p in paths]).map_batches(probe_batch, batch_size=batch)
            n = sum(t.num_rows for t in ray.get(ds.to_arrow_refs()))
            assert n == len(paths)
            times.append(time.perf_counter() - t0)
    finally:
        ray.shutdown()
    return times


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--threads", type=int, default=8, help="header-read threads inside each process")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temp dir)")
    ap.add_argument("--existing", type=Path, default=None,
                    help="read the audio files already under this folder (kept) instead of generating")
    ARGS = ap.parse_args()
    root = ARGS.existing or Path(tempfile.mkdtemp(prefix="bench_probe_", dir=ARGS.dir))
    try:
        t0 = time.perf_counter()
        if ARGS.existing:
            paths = sorted(str(q) for q in root.rglob("*") if q.suffix in (".wav", ".flac"))[: ARGS.files]
        else:
            paths = generate(root, ARGS.files, max(1, os.cpu_count() or 1))
        gen_s = time.perf_counter() - t0
        print(f"{'found' if ARGS.existing else 'generated'} {len(paths):,} WAV/FLAC files in {gen_s:.1f} s "
              f"under {root} ({os.cpu_count()} CPUs)")
        rows: list[tuple[str, int, list[float]]] = []
        rows.append(("1 process x 1 thread", 1, [run_processes(None, paths, 1, 1) for _ in range(ARGS.repeats)]))
        rows.append((f"1 process x {ARGS.threads} threads", 1,
                     [run_processes(None, paths, 1, ARGS.threads) for _ in range(ARGS.repeats)]))
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            pool.map(_probe, [([], 1)] * 2)  # start the workers before timing
            rows.append((f"2 processes x {ARGS.threads} threads", 2,
                         [run_processes(pool, paths, 2, ARGS.threads) for _ in range(ARGS.repeats)]))
        ray_times = run_ray(paths, ARGS.threads, batch=max(1000, len(paths) // 16))
        if ray_times is not None:
            rows.append((f"Ray Data map_batches ({os.cpu_count()} CPUs)", os.cpu_count() or 1, ray_times))
        print(f"\n{'configuration':<40} {'files/s (median)':>17} {'per process':>12}  runs (s)")
        rates = {}
        for name, procs, times in rows:
            rate = len(paths) / statistics.median(times)
            rates[name] = rate
            print(f"{name:<40} {rate:>17,.0f} {rate / procs:>12,.0f}  {' '.join(f'{t:.2f}' for t in times)}")
        one = rates[f"1 process x {ARGS.threads} threads"]
        two = rates[f"2 processes x {ARGS.threads} threads"]
        print(f"\nper-core header reads (1 process, threads): {one:,.0f} files/s (goal >= 2,000)")
        print(f"scaling 1 -> 2 processes: x{two / one:.2f}")
        if ray_times is None:
            print("Ray: not installed (pip install 'speech-dataprep[ray]'), skipped")
    finally:
        if not ARGS.existing:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
