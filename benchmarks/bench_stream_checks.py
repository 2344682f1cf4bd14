"""Time and peak RSS of the loader's column cache and row cache builds and of `dataprep verify --manifest`.

    python benchmarks/bench_stream_checks.py                           # 1M and 10M rows, 3 repeats
    python benchmarks/bench_stream_checks.py --rows 1000000 --repeats 1
    python benchmarks/bench_stream_checks.py --ops rows                # the row cache build only
    python benchmarks/bench_stream_checks.py --baseline /path/to/older/checkout   # old vs new

Builds once per size (kept in ``--work``) a manifest of N rows (``bench_plan.synthetic``, one audio
file per utterance), buckets and an 8-rank plan. Each measurement in a fresh subprocess: ``cache
build`` (``ColumnCache.open``, empty cache), ``cache open`` (warm, plus one gather), ``rows build``
(``ManifestRows.open``, empty cache) and ``verify`` (``dataprep verify PLAN --manifest M``).
Prints medians of ``--repeats``: wall and CPU seconds (the figure to trust on a shared machine),
peak RSS (``VmHWM``; ``ru_maxrss`` where /proc is missing) and its growth over the RSS after
imports; ``--baseline DIR`` the same with another checkout's code. Run it with ``nice``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_plan import buckets_for, synthetic_blocks  # noqa: E402

from manifests.hash_cache import manifest_hash  # noqa: E402
from manifests.manifest_write import write_parquet_stream  # noqa: E402
from manifests.schema import POLARS_SCHEMA, conform, manifest_schema  # noqa: E402

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
op, manifest, plan, cache = sys.argv[2:6]
if op == "verify":
    from dataprep.cli.plan import verify_cmd
elif op == "rows":
    from dataprep.integrations.rows import ManifestRows
else:
    from manifests.column_cache import ColumnCache
    from manifests.plan_files import PlanShard

def rss(key):
    try:
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

base = rss("VmRSS:")
c0, t = os.times(), time.perf_counter()
if op == "verify":
    verify_cmd(plan_dir=Path(plan), manifest=Path(manifest))
elif op == "rows":
    ManifestRows.open(manifest, cache)
else:
    cols = ColumnCache.open(manifest, cache)
    if op == "open":
        pb = next(PlanShard(plan, 0).iter_batches())
        cols.gather(pb.rows, pb.ids).texts
wall, c1 = time.perf_counter() - t, os.times()
print(json.dumps({"s": wall, "cpu": c1.user + c1.system - c0.user - c0.system, "mib": rss("VmHWM:"),
                  "grow": rss("VmHWM:") - base}))
"""
#: what each measurement is called in the table
LABELS = {"build": "cache build", "open": "cache open", "rows": "rows build", "verify": "verify"}


def build(work: Path, n: int) -> tuple[Path, Path]:
    """The manifest and plan of ``n`` rows in ``work`` (made once)."""
    work.mkdir(parents=True, exist_ok=True)
    manifest, buckets, plan = work / "m.parquet", work / "buckets.json", work / "plan"

    def tables():
        for df in synthetic_blocks(n):
            i = pl.col("id").str.slice(4).cast(pl.Int64)
            chars = (pl.col("duration") * 15).cast(pl.Int64).clip(1, 400)
            yield conform(df.with_columns(
                pl.format("/data/spk{}/utt-{}.flac", i // 100, i).alias("audio_path"),
                pl.lit("the quick brown fox jumps over the lazy dog " * 10).str.slice(i % 40, chars).alias("text"),
                pl.lit("en").alias("lang"),
                (pl.col("num_tokens") / pl.col("duration")).alias("tps"),
            ), POLARS_SCHEMA).to_arrow()

    if not manifest.exists():
        write_parquet_stream(tables, manifest, manifest_schema(False), "manifest")
    if not (plan / "plan.json").exists():
        from dataprep.planning import PlanOptions, build_plan

        buckets_for(next(synthetic_blocks(min(n, 5_000_000))), buckets, 600.0)
        build_plan(manifest, buckets, plan, PlanOptions(world_size=8, seed=0, epochs=1))
    return manifest, plan


def measure(repo: Path, op: str, manifest: Path, plan: Path, cache: Path, env: dict[str, str]) -> dict[str, float]:
    if op in ("build", "rows"):
        shutil.rmtree(cache, ignore_errors=True)
    res = subprocess.run([sys.executable, "-c", CHILD, str(repo), op, str(manifest), str(plan),
                          str(cache)], capture_output=True, text=True, env=env)
    if res.returncode:
        sys.exit(f"{op} with {repo} failed: {res.stderr.strip()[-400:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000000,10000000", help="comma-separated manifest sizes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_stream_checks"))
    ap.add_argument("--baseline", type=Path, help="another checkout, measured the same way (old code path)")
    ap.add_argument("--ops", default="build,open,rows,verify",
                    help="comma-separated measurements: build, open (column cache), rows (row cache build), verify")
    args = ap.parse_args()
    ops = args.ops.split(",")
    if any(op not in LABELS for op in ops):
        sys.exit(f"--ops: give some of {', '.join(LABELS)}, not {args.ops!r}")
    repos = [("new", REPO)] + ([("old", args.baseline.resolve())] if args.baseline else [])
    print(f"{'rows':>12} {'code':>4} {'operation':>12} {'wall s':>7} {'CPU s':>7} {'peak RSS MiB':>13} "
          f"{'over imports':>13}")
    for n in (int(x) for x in args.rows.split(",")):
        work = args.work / str(n)
        manifest, plan = build(work, n)
        # the hash verification cache of this run (the manifest verified once, outside the timings)
        env = dict(os.environ, SPEECH_DATAPREP_CACHE=str(work / "hash-cache"), POLARS_MAX_THREADS="2",
                   OMP_NUM_THREADS="2")
        os.environ["SPEECH_DATAPREP_CACHE"] = env["SPEECH_DATAPREP_CACHE"]
        manifest_hash(manifest)
        for op in ops:
            for name, repo in repos:
                cache = work / (f"rows-{name}" if op == "rows" else f"cache-{name}")
                if op == "open" and not cache.exists():
                    measure(repo, "build", manifest, plan, cache, env)
                got = [measure(repo, op, manifest, plan, cache, env) for _ in range(args.repeats)]
                med = {k: statistics.median(g[k] for g in got) for k in ("s", "cpu", "mib", "grow")}
                print(f"{n:>12,} {name:>4} {LABELS[op]:>12} {med['s']:>7.2f} "
                      f"{med['cpu']:>7.2f} {med['mib']:>13.0f} {med['grow']:>13.0f}", flush=True)


if __name__ == "__main__":
    main()
