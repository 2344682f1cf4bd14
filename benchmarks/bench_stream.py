"""``dataprep stats``, ``filter --max-tps 25`` and ``padding`` on a synthetic manifest: wall
time, CPU time and peak RSS per size, this checkout and (``--baseline DIR``) another one side
by side, outputs compared byte for byte.

    python benchmarks/bench_stream.py --rows 10000000                         # 10M, 3 repeats
    python benchmarks/bench_stream.py --rows 10000000 --baseline ../main      # old vs new
    python benchmarks/bench_stream.py --rows 10000000 --repeats 1 --only padding --world-sizes 128

``padding`` reads a ``buckets.json`` fitted once (30 buckets, kept in ``--dir`` with the
manifest); both checkouts run it under ``--padding-memory-limit`` (default 1GiB). Rows are drawn
as bench_plan.py draws them, plus ``tps``, a language and an audio path. Each measurement is a
fresh subprocess (2 threads) running the command as a user types it; medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_plan import synthetic_blocks  # noqa: E402
from manifests.manifest_write import write_parquet_stream  # noqa: E402
from manifests.schema import POLARS_SCHEMA, conform, manifest_schema  # noqa: E402

LANGS = np.array(["en", "id", "ps"])

CHILD = r"""
import json, os, resource, runpy, sys, time
t0 = time.perf_counter()
sys.argv = ["dataprep", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("dataprep.cli", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
wall = time.perf_counter() - t0
try:  # this process's own peak (ru_maxrss keeps the parent's size from before the exec)
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
except (OSError, StopIteration):
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
ru = resource.getrusage(resource.RUSAGE_SELF)
with open(os.environ["BENCH_STREAM_OUT"], "w") as fh:
    json.dump({"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_gib": hwm, "code": code}, fh)
"""


def write_manifest_for(n: int, path: Path) -> None:
    """``n`` synthetic rows (see the module docstring) written in blocks."""
    def tables():
        for i, df in enumerate(synthetic_blocks(n)):
            rng = np.random.default_rng(i)
            df = df.with_columns((pl.col("num_tokens") / pl.col("duration")).alias("tps"),
                                 pl.Series("lang", LANGS[rng.integers(0, 3, df.height)]),
                                 pl.format("/data/audio/{}.flac", pl.col("id")).alias("audio_path"))
            yield conform(df, POLARS_SCHEMA).to_arrow()

    write_parquet_stream(tables, path, manifest_schema(False), "manifest")


def run(code_dir: Path, args: list[str], cwd: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", dir=cwd) as out:
        env = dict(os.environ, POLARS_MAX_THREADS="2", OMP_NUM_THREADS="2", PYTHONPATH=str(code_dir),
                   BENCH_STREAM_OUT=out.name)
        res = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=cwd, env=env, capture_output=True, text=True)
        got = json.loads(Path(out.name).read_text() or "{}")
    if res.returncode or got.get("code"):
        sys.exit(f"{code_dir}: dataprep {' '.join(args)} failed: {(res.stderr or res.stdout).strip()[-400:]}")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[10_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="a checkout whose `dataprep` to run side by side (the old path)")
    ap.add_argument("--baseline-max-rows", type=int, default=10_000_000,
                    help="skip the baseline above this size (the whole-frame path needs the manifest in memory)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "bench_stream")
    ap.add_argument("--only", choices=["stats", "filter", "padding"], help="measure one command")
    ap.add_argument("--padding-memory-limit", default="1GiB", help="padding --memory-limit (both paths)")
    ap.add_argument("--world-sizes", help="padding --world-sizes, e.g. 128 (both paths)")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    rows_out = []
    for n in args.rows:
        manifest = args.dir / f"manifest-{n}.parquet"
        if not manifest.exists():
            print(f"writing {manifest} ({n:,} rows)", flush=True)
            write_manifest_for(n, manifest)
        buckets = args.dir / f"buckets-{n}.json"
        if (args.only in (None, "padding")) and not buckets.exists():
            run(REPO, ["fit-buckets", str(manifest), "--num-buckets", "30", "-o", str(buckets)], args.dir)
        paths = [("new", REPO)]
        if args.baseline is not None and n <= args.baseline_max_rows:
            paths.append(("old", args.baseline.resolve()))
        for label, code_dir in paths:
            work = args.dir / f"out-{label}-{n}"
            work.mkdir(exist_ok=True)
            commands = {
                "stats": ["stats", str(manifest), "--json", "stats.json"],
                "filter --max-tps 25": ["filter", str(manifest), "--max-tps", "25", "-o", "kept.parquet",
                                        "--rejects", "rejects.parquet"],
                "padding": ["padding", str(manifest), "--buckets", str(buckets), "--json", "padding.json",
                            "--memory-limit", args.padding_memory_limit,
                            *(["--world-sizes", args.world_sizes] if args.world_sizes else [])],
            }
            for name, cmd in commands.items():
                if args.only and not name.startswith(args.only):
                    continue
                runs = []
                for _ in range(args.repeats):
                    runs.append(run(code_dir, cmd, work))
                    print(f"  {n:>12,} {name:<20} {label}: {runs[-1]['wall']:7.1f} s wall, {runs[-1]['cpu']:7.1f} s CPU, "
                          f"{runs[-1]['rss_gib']:5.2f} GiB", flush=True)
                rows_out.append((n, name, label, *(statistics.median(r[k] for r in runs) for k in ("wall", "cpu", "rss_gib"))))
        if len(paths) == 2:
            outputs = [f for f in ("stats.json", "kept.parquet", "rejects.parquet", "padding.json")
                       if (args.dir / f"out-new-{n}" / f).exists() and (args.dir / f"out-old-{n}" / f).exists()]
            same = [f for f in outputs
                    if filecmp.cmp(args.dir / f"out-new-{n}" / f, args.dir / f"out-old-{n}" / f, shallow=False)]
            print(f"  {n:>12,} identical outputs (new vs old): {', '.join(same) or 'none'}", flush=True)
    print(f"\nmedians of {args.repeats} run(s), 2 threads")
    print(f"{'rows':>12}  {'command':<20} {'path':<4} {'wall (s)':>9} {'CPU (s)':>8} {'CPU us/row':>10} "
          f"{'peak RSS (GiB)':>15}")
    for n, name, label, wall, cpu, rss in rows_out:
        print(f"{n:>12,}  {name:<20} {label:<4} {wall:9.1f} {cpu:8.1f} {cpu / n * 1e6:10.2f} {rss:15.2f}")


if __name__ == "__main__":
    main()
