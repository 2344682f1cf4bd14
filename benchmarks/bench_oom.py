"""OOMptimizer estimate benchmark (CPU only, no GPU needed).

    python benchmarks/bench_oom.py [--data ../shared/data] [--models canary-1b,canary-1b-flash,parakeet-tdt-0.6b]
                                   [--exact-buckets 2] [--skip-headline]

1. Wall time to estimate 30x2 LibriSpeech train-clean-100 buckets for an 80 GiB GPU, per model:
   the fitted estimate against full traces per bucket (``exact_trace``, timed on
   ``--exact-buckets`` buckets and extrapolated), and the fitted peak's max error on those buckets.
2. The transducer (parakeet-tdt-0.6b) at 40 s, U = 200: estimated peak, batched vs
   sample-wise, at B = 16, 64, 256, 1024, and the largest batch within the 80 GiB budget.
3. The headline: mean batch and padded seconds per step with canary-1b-flash batch sizes
   estimated for 80 GiB (2D, 30x2) vs the 1D 360 s cumulative-duration rule, on LibriSpeech
   100 h and Common Voice id+ps (``bucketing.padding.padding_report``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_buckets import load  # noqa: E402  (sentencepiece tokens as the bucketing benchmark)

from bucketing.fit_passes import fit_spec  # noqa: E402
from bucketing.fit import grid_from_spec  # noqa: E402
from bucketing.padding import padding_report  # noqa: E402

GIB = 2**30
GPU = 80 * GIB
CUMULATIVE_RULE_S = 360.0  # Canary-1B's batch_duration


def _spec(d: np.ndarray, t: np.ndarray):
    return fit_spec(d, t, num_buckets=30, num_subbuckets=2)[0]


def _pick(n: int, k: int) -> list[int]:
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, max(1, min(k, n)))}, reverse=True)


def estimate_timing(spec, model: str, exact_buckets: int) -> dict[str, float]:
    from manifests.buckets_file import BucketSpec
    from oom import estimate, fit
    from oom.optimize import oomptimize
    from oom.options import OomOptions
    from oom.step import Shape

    fit.fitted_model.cache_clear()
    estimate.optimizer_profile.cache_clear()
    t0, c0 = time.perf_counter(), time.process_time()
    sized = oomptimize(spec, OomOptions(model, estimate=True, gpu_memory=GPU))
    after, after_cpu = time.perf_counter() - t0, time.process_time() - c0
    fm = fit.fitted_model(model, "batched")
    per, per_cpu, errs = [], [], []
    for i in _pick(len(spec.buckets), exact_buckets):
        b = sized.buckets[i]
        one = BucketSpec(buckets=(dataclasses.replace(spec.buckets[i], index=0, batch_size=None),))
        estimate.shape_estimator.cache_clear()
        t0, c0 = time.perf_counter(), time.process_time()
        oomptimize(one, OomOptions(model, estimate=True, gpu_memory=GPU, exact_trace=True))
        per.append(time.perf_counter() - t0)
        per_cpu.append(time.process_time() - c0)
        shape = Shape.of_bucket(b.max_duration, b.max_tokens)
        ref = estimate.shape_estimator(model, shape).peak(b.batch_size)
        errs.append(abs(fm.peak(b.batch_size, shape) - ref) / ref)
    return {"after_s": after, "after_cpu_s": after_cpu, "before_cpu_s": float(np.mean(per_cpu)) * len(spec.buckets),
            "before_s_per_bucket": float(np.mean(per)),
            "before_s": float(np.mean(per)) * len(spec.buckets), "max_err": max(errs), "checked": len(per),
            "mean_batch": float(np.mean([b.batch_size for b in sized.buckets]))}


def transducer_table(model: str = "parakeet-tdt-0.6b") -> None:
    from oom.fit import fitted_model
    from manifests.units import parse_bytes
    from oom.search import ProbeResult, find_max_batch
    from oom.step import Shape

    shape = Shape.of_bucket(40.0, 200)
    budget = int(0.9 * GPU) - parse_bytes("5%", GPU)
    print(f"\n{model} at 40 s (T' = 500), U = 200, estimated; budget {budget / GIB:.1f} GiB of 80 GiB")
    print("mode          B=16 GiB  B=64 GiB  B=256 GiB  B=1024 GiB  largest B  joint GiB at B=64")
    for mode in ("batched", "sample-wise"):
        t0 = time.perf_counter()
        fm = fitted_model(model, mode)
        peaks = [fm.peak(b, shape) / GIB for b in (16, 64, 256, 1024)]
        best = find_max_batch(lambda b: ProbeResult(fits=fm.peak(b, shape) <= budget), tolerance=0.0, max_batch=1 << 14)
        joint = fm.explain(64, shape).joint / GIB
        print(f"{mode:12s}  {peaks[0]:8.1f}  {peaks[1]:8.1f}  {peaks[2]:9.1f}  {peaks[3]:10.1f}  {best.batch_size:9d}  "
              f"{joint:8.1f}   (fit {time.perf_counter() - t0:.0f} s)")
    br = fitted_model(model, "batched").explain(64, shape)
    print("breakdown at B=64, batched (GiB):",
          {k: round(v / GIB, 2) if isinstance(v, int) else v for k, v in br.to_json().items()})


def headline(corpora: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    from oom.optimize import oomptimize
    from oom.options import OomOptions

    print("\ncanary-1b-flash, 80 GiB estimated (2D 30x2) vs the 1D 360 s cumulative rule")
    print("corpus                     scheme          mean_batch  padded_s/step  audio_pad")
    for name, (d, t) in corpora.items():
        spec = _spec(d, t)
        sized = oomptimize(spec, OomOptions("canary-1b-flash", estimate=True, gpu_memory=GPU))
        sizes = np.array([b.batch_size for b in sized.buckets])
        rep = padding_report(d, t, grid_from_spec(spec), sizes, cumulative_budget=CUMULATIVE_RULE_S, fixed_lengths=())
        rows = {}
        for scheme in ("1d-cumulative", "2d"):
            s = rep["schemes"][scheme]
            real = s["num_rows"] * float(np.mean(d))  # included rows x mean duration (s)
            padded = real / max(1e-9, 1.0 - s["audio_padding"]) / s["num_batches"]
            rows[scheme] = s["mean_batch_size"]
            print(f"{name:26s} {scheme:14s}  {s['mean_batch_size']:10.1f}  {padded:13.0f}  {s['audio_padding']:9.3f}")
        print(f"{name:26s} ratio 2d / 1d-cumulative mean batch: {rows['2d'] / rows['1d-cumulative']:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--models", default="canary-1b,canary-1b-flash,parakeet-tdt-0.6b")
    ap.add_argument("--exact-buckets", type=int, default=2, help="buckets timed with full traces per model")
    ap.add_argument("--skip-headline", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(2)
    corpora = load(Path(a.data))
    d, t = corpora["librispeech.train-clean-100.csv"]
    spec = _spec(d, t)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; LibriSpeech 100 h: {len(spec.buckets)} buckets")
    if not a.skip_timing:
        print("wall s (cpu s): the machine is shared; cpu s is this process's CPU time")
        print("model               after: fitted  before: full traces (extrapolated)  speed-up  max_err  checked")
        for model in a.models.split(","):
            r = estimate_timing(spec, model, a.exact_buckets)
            print(f"{model:18s}  {r['after_s']:5.1f} ({r['after_cpu_s']:5.1f})  "
                  f"{r['before_s']:7.0f} ({r['before_cpu_s']:6.0f}), {r['before_s_per_bucket']:.1f} s/bucket"
                  f"  {r['before_s'] / r['after_s']:7.1f}x  {r['max_err']:.2e}  {r['checked']}", flush=True)
    transducer_table()
    if not a.skip_headline:
        headline(corpora)
    return 0


if __name__ == "__main__":
    sys.exit(main())
