"""fit-buckets held in memory vs spilled: wall time, peak RSS and whether buckets.json is the same.

    python benchmarks/bench_stream_fit.py                      # 10M rows, 30x2, 3 runs each
    python benchmarks/bench_stream_fit.py --rows 40000000 --runs 1 --memory-limit 1GiB
    python benchmarks/bench_stream_fit.py --rows 20000 --runs 1  # a toy run

The manifest is bench_plan.py's synthetic corpus (real (duration, characters per second)
pairs of ../shared/data resampled with 5% jitter; tokens = chars / 3.5 + a 9-token prompt),
written in blocks. Each fit runs in a fresh subprocess (2 cores) with the default options, as
``fit-buckets`` fits (``fit_buckets_file``): under the default memory limit (half the
machine's: a corpus that fits is one block held in memory) and under ``--memory-limit`` (512
MiB by default: blocks and spill files next to the output when the corpus does not fit). Wall and CPU time (user + system: what a busy machine distorts least) include
the import; peak RSS is the child's VmHWM. Prints medians,
and "identical" when both write the same buckets.json bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_plan import synthetic_blocks  # noqa: E402
from manifests.manifest_write import write_parquet_stream  # noqa: E402
from manifests.schema import POLARS_SCHEMA, conform, manifest_schema  # noqa: E402
from manifests.units import parse_bytes  # noqa: E402

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
limit = int(sys.argv[3])
from dataprep.analysis import FitOptions, fit_buckets_file
fit_buckets_file(sys.argv[1], sys.argv[2], FitOptions(memory_limit=limit or None))
wall = time.perf_counter() - t0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_gib": hwm}))
"""


def write_corpus(rows: int, path: Path) -> None:
    def tables():
        for df in synthetic_blocks(rows):
            yield conform(df, POLARS_SCHEMA).to_arrow()

    write_parquet_stream(tables, path, manifest_schema(False), "manifest")


def run_fit(manifest: Path, out: Path, memory_limit: int) -> dict:
    env = dict(os.environ, POLARS_MAX_THREADS="2", OMP_NUM_THREADS="2", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-c", CHILD, str(manifest), str(out), str(memory_limit)]
    if os.path.exists("/usr/bin/taskset"):
        cmd = ["taskset", "-c", "0,1", *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        sys.exit(f"fit failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--memory-limit", default="512MiB", help="The second fit's limit.")
    ap.add_argument("--dir", type=Path, default=None, help="Where the manifest and spill files go.")
    a = ap.parse_args()
    limit = parse_bytes(a.memory_limit)
    if a.dir is not None:
        a.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        work = Path(tmp)
        manifest = work / "m.parquet"
        write_corpus(a.rows, manifest)
        print(f"{a.rows:,} rows, {manifest.stat().st_size / 2**20:.0f} MiB manifest; second limit "
              f"{limit / 2**20:.0f} MiB", flush=True)
        outputs = {}
        for name, lim in (("default", 0), ("limited", limit)):
            runs = [run_fit(manifest, work / f"{name[:2]}.json", lim) for _ in range(a.runs)]
            wall = statistics.median(r["wall"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in runs)
            rss = statistics.median(r["rss_gib"] for r in runs)
            print(f"{name:>10}: {wall:6.2f} s wall  {cpu:6.2f} s CPU  peak RSS {rss:5.2f} GiB  "
                  f"({1e9 * wall / max(a.rows, 1):.0f} ns/row)", flush=True)
            outputs[name] = (work / f"{name[:2]}.json").read_bytes()
        same = outputs["default"] == outputs["limited"]
        print("buckets.json:", "identical" if same else "DIFFERENT")
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
