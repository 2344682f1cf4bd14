"""Time to the first batch through each trainer integration on a large plan, and export memory.

    python benchmarks/bench_integrations.py [--utterances 10000000] [--work DIR]
        [--nemo-python /path/to/python-with-nemo] [--export-rows 1000000]

The plan is the one of ``benchmarks/bench_loader.py`` (built there, once, in --work). Prints the
median over fresh processes (imports not counted, warm caches) of the time to the first batch of:
PyTorch ``PlanBatchSampler`` (a dataset returning row numbers); Lhotse ``PlanSampler`` (the first
step's ``CutSet`` through a ``PlanDataLoader``); NeMo ``get_plan_dataloader`` (with
``--nemo-python``, an interpreter where NeMo imports; goal <= 500 ms). The one-time row cache
build is printed apart. ``--export-rows N`` also times ``export nemo`` and ``export lhotse`` of an
N-row manifest and of one tenth of it in child processes and prints their peak RSS.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]

_TORCH = """
import sys, time
from torch.utils.data import DataLoader
from dataprep.integrations.torch import PlanBatchSampler
class Rows:
    def __getitem__(self, i): return i
    def __len__(self): return 1 << 62
t = time.perf_counter()
batch = next(iter(DataLoader(Rows(), batch_sampler=PlanBatchSampler(sys.argv[1], 0), collate_fn=list)))
print(time.perf_counter() - t, len(batch))
"""

_LHOTSE = """
import sys, time
from dataprep.integrations.lhotse import PlanDataLoader, PlanSampler
from manifests.plan_meta import read_plan_meta
class Cuts:
    def __getitem__(self, cuts): return cuts
ws = read_plan_meta(sys.argv[1]).world_size
t = time.perf_counter()
cuts = next(iter(PlanDataLoader(Cuts(), PlanSampler(sys.argv[1], sys.argv[2], 0, ws, cache_dir=sys.argv[3]))))
print(time.perf_counter() - t, len(cuts))
"""

_NEMO = """
import os, sys, time
os.environ["SPEECH_DATAPREP_CACHE"] = sys.argv[3]
import nemo.collections.common.data.lhotse.dataloader  # noqa: F401  (NeMo imported, not timed)
from dataprep.integrations.nemo import get_plan_dataloader
from manifests.plan_meta import read_plan_meta
class Cuts:
    def __getitem__(self, cuts): return cuts
ws = read_plan_meta(sys.argv[1]).world_size
t = time.perf_counter()
cfg = {"use_lhotse": True, "plan_dir": sys.argv[1], "manifest": sys.argv[2], "num_workers": 0}
cuts = next(iter(get_plan_dataloader(cfg, global_rank=0, world_size=ws, dataset=Cuts())))
print(time.perf_counter() - t, len(cuts))
"""


def fresh(python: str, code: str, *args: str) -> tuple[float, int]:
    out = subprocess.run([python, "-c", code, *args], check=True, capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    t, n = out.stdout.strip().splitlines()[-1].split()
    return float(t), int(n)


def median_fresh(python: str, code: str, repeats: int, *args: str) -> tuple[float, int]:
    runs = [fresh(python, code, *args) for _ in range(repeats)]
    return statistics.median(t for t, _ in runs), runs[0][1]


def export_memory(work: Path, rows: int) -> None:
    """Peak RSS and time of both exports at ``rows`` and ``rows // 10`` (child processes)."""
    import numpy as np
    import polars as pl

    from bucketing.fit_passes import fit_spec
    from dataprep.testing import write_tone
    from manifests.buckets_file import write_buckets
    from manifests.manifest_write import write_manifest

    files = [str(write_tone(work / "audio-x" / f"f{i}.flac", 35.0, sample_rate=16000, seed=i)) for i in range(4)]
    for n in (rows // 10, rows):
        m, b = work / f"export-{n}.parquet", work / f"export-{n}.buckets.json"
        if not m.exists():
            rng = np.random.default_rng(0)
            dur = np.clip(rng.lognormal(np.log(6.0), 0.6, n), 0.5, 30.0).round(2)
            tok = np.maximum(1, np.round(dur * 3)).astype(np.int32)
            df = pl.DataFrame({"id": pl.int_range(0, n, eager=True).cast(pl.String).str.zfill(9), "duration": dur,
                               "num_tokens": tok, "audio_path": np.asarray(files)[np.arange(n) % 4],
                               "offset": (np.arange(n) % 3).astype(np.float64),
                               "extra": pl.Series([None, '{"pnc":"yes","speaker":"s1"}'] * (n // 2) + [None] * (n % 2))})
            df = df.with_columns(pl.lit("a b c").alias("text"), pl.lit("en").alias("lang"),
                                 (pl.col("num_tokens") / pl.col("duration")).alias("tps"))
            write_manifest(df, m)
            spec, _ = fit_spec(dur, tok, num_buckets=30, num_subbuckets=2, max_duration_budget=600.0)
            write_buckets(spec, b)
        for kind in ("nemo", "lhotse"):
            out = work / f"export-{kind}-{n}"
            code = (f"import resource; from dataprep.integrations.export import export_{kind}; "
                    f"export_{kind}({str(b)!r}, {str(m)!r}, {str(out)!r}); "
                    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True,
                                 env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
            took = time.perf_counter() - t
            peak = int(res.stdout.split()[-1])
            print(f"export {kind} of {n:,} rows: {took:.1f} s, peak RSS {peak / 1024:.0f} MiB", flush=True)
            shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--utterances", type=int, default=10_000_000)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_loader"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nemo-python", default=None)
    ap.add_argument("--export-rows", type=int, default=0)
    ap.add_argument("--only-export", action="store_true", help="skip the plan and the first-batch timings")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.only_export:
        export_memory(args.work, args.export_rows)
        return
    from bench_loader import build  # type: ignore[import-not-found]

    manifest, plan, _ = build(args.work, args.utterances, args.world_size)
    cache = args.work / "rows-cache"
    probe = args.work / "rows-cache-probe"
    shutil.rmtree(probe, ignore_errors=True)
    from dataprep.integrations.rows import ManifestRows

    t = time.perf_counter()
    ManifestRows.open(manifest, probe)
    print(f"manifest row cache build (one-time per manifest content, cold): {time.perf_counter() - t:.1f} s, "
          f"{sum(p.stat().st_size for p in probe.glob('*.arrow')) / 2**30:.2f} GiB", flush=True)
    shutil.rmtree(probe, ignore_errors=True)
    ManifestRows.open(manifest, cache)
    t, n = median_fresh(sys.executable, _TORCH, args.repeats, str(plan))
    print(f"time to first batch, PyTorch PlanBatchSampler ({n} rows): {t * 1e3:.1f} ms (goal <= 500 ms)", flush=True)
    t, n = median_fresh(sys.executable, _LHOTSE, args.repeats, str(plan), str(manifest), str(cache))
    print(f"time to first batch, Lhotse PlanSampler CutSet ({n} cuts): {t * 1e3:.1f} ms (goal <= 500 ms)", flush=True)
    if args.nemo_python:
        t, n = median_fresh(args.nemo_python, _NEMO, args.repeats, str(plan), str(manifest), str(cache))
        print(f"time to first batch, NeMo get_plan_dataloader CutSet ({n} cuts): {t * 1e3:.1f} ms (goal <= 500 ms)",
              flush=True)
    if args.export_rows:
        export_memory(args.work, args.export_rows)


if __name__ == "__main__":
    main()
