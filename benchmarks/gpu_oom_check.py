"""Measured vs estimated batch sizes and peak memory, per bucket (the OOMptimizer on a GPU).

Runs each ``--models`` entry (``name`` or ``name:loss_mode``; default canary-1b-flash, then
the parakeet-tdt-0.6b transducer batched and sample-wise) within one time limit: fits 30x2
buckets on LibriSpeech train-clean-100 (or reads ``--buckets``), takes the largest bucket and
evenly spaced others, estimates each without the GPU, then runs the real CUDA search (one
subprocess per probe) from the estimated batch size; prints one row per bucket:

    bucket  max_s  max_tok  bs_meas  bs_est  peak_meas_GiB  peak_est_GiB  est/meas  step_s

``peak_est`` is the estimate at the *measured* batch size, so est/meas compares the same
step. ``--dry-run`` does all of it on CPU with the ``tiny`` model (CPU probes measure live
tensor bytes instead of ``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 10


def find_data(explicit: str | None) -> Path:
    cands = [Path(explicit)] if explicit else []
    cands += [ROOT.parent / "shared" / "data", ROOT / "shared" / "data", ROOT / "shared"]
    for c in cands:
        if (c / "librispeech.train-clean-100.csv").exists():
            return c
    raise SystemExit(f"no LibriSpeech CSVs in {[str(c) for c in cands]}; pass --data or --buckets")


def fit_librispeech(data: Path, workdir: Path):
    import polars as pl
    import sentencepiece as spm

    from bucketing.fit import grid_to_buckets
    from bucketing.fit_passes import fit_buckets
    from manifests.buckets_file import BucketSpec

    dev = pl.read_csv(data / "librispeech.dev-clean.csv")
    corpus = workdir / "text.txt"
    corpus.write_text("\n".join(dev["text"].to_list()).lower() + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(workdir / "bpe"), vocab_size=1024, model_type="bpe",
        character_coverage=1.0, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(workdir / "bpe.model"))
    train = pl.read_csv(data / "librispeech.train-clean-100.csv")
    tokens = np.array([len(x) for x in sp.encode([t.lower() for t in train["text"].to_list()])]) + PROMPT_TOKENS
    dur = train["duration"].to_numpy()
    fit = fit_buckets(dur, tokens, 30, 2)
    return BucketSpec(buckets=grid_to_buckets(fit.grid), fit={"source": "librispeech.train-clean-100"})


def subset(spec, k: int):
    n = len(spec.buckets)
    idx = sorted({int(round(x)) for x in np.linspace(0, n - 1, min(k, n))}, reverse=True)
    return [spec.buckets[i] for i in idx]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buckets", help="buckets.json (default: fit 30x2 on LibriSpeech)")
    ap.add_argument("--data", help="folder with librispeech.*.csv")
    ap.add_argument("--models", default=None,
                    help="comma-separated name[:loss_mode] (default canary-1b-flash,parakeet-tdt-0.6b:batched,"
                         "parakeet-tdt-0.6b:sample-wise; --dry-run: the tiny and tiny-rnnt counterparts)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--subset", type=int, default=3, help="buckets to measure per model")
    ap.add_argument("--tolerance", type=float, default=0.1)
    ap.add_argument("--memory-fraction", type=float, default=0.9)
    ap.add_argument("--margin", default="5%")
    ap.add_argument("--gpu-memory", help="device memory for CPU dry runs, e.g. 256MiB")
    ap.add_argument("--time-limit", type=float, default=420.0, help="stop measuring new buckets after this many s")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, 32MiB budget")
    a = ap.parse_args()
    if a.dry_run:
        a.models = a.models or "tiny,tiny-rnnt:batched,tiny-rnnt:sample-wise"
        a.device, a.gpu_memory = "cpu", a.gpu_memory or "32MiB"
        a.subset = min(a.subset, 2)
        a.tolerance = max(a.tolerance, 0.5)

    a.models = a.models or "canary-1b-flash,parakeet-tdt-0.6b:batched,parakeet-tdt-0.6b:sample-wise"
    import torch

    from manifests.buckets_file import BucketSpec, read_buckets
    from oom.fit import fitted_model
    from oom.isolate import device_info
    from manifests.units import parse_bytes
    from oom.optimize import oomptimize
    from oom.options import OomOptions
    from oom.step import Shape

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        spec = read_buckets(a.buckets) if a.buckets else fit_librispeech(find_data(a.data), Path(tmp))
        chosen = subset(spec, a.subset)
        cache = str(Path(tmp) / "cache")
        if a.device.startswith("cuda"):
            info = device_info(a.device)
            total = info["total_memory"] if a.gpu_memory is None else parse_bytes(a.gpu_memory)
            gpu = f"{info['name']} {info['total_memory'] / 2**30:.1f} GiB"
        else:
            total, gpu = parse_bytes(a.gpu_memory), f"cpu (budget from {a.gpu_memory})"
        print(f"models {a.models}  device {gpu}  torch {torch.__version__}  fraction {a.memory_fraction}  "
              f"margin {a.margin}  buckets {[b.index for b in chosen]} of {len(spec.buckets)}", flush=True)
        common = dict(gpu_memory=total, memory_fraction=a.memory_fraction, margin=a.margin,
                      tolerance=a.tolerance, cache_dir=cache)
        rows = []
        for entry in a.models.split(","):
            model, _, mode = entry.partition(":")
            mode = mode or "batched"
            for b in chosen:
                one = BucketSpec(buckets=(dataclasses.replace(b, index=0, batch_size=None),))
                t0 = time.perf_counter()
                est = oomptimize(one, OomOptions(model, estimate=True, loss_mode=mode, **common)).buckets[0]
                t_est = time.perf_counter() - t0
                if time.perf_counter() - t_start > a.time_limit:
                    print(f"time limit reached; {entry} bucket {b.index} and later not measured", flush=True)
                    break
                t0 = time.perf_counter()
                meas = oomptimize(one, OomOptions(model, device=a.device, start_batch=max(est.batch_size, 1), loss_mode=mode,
                                  **{**common, "gpu_memory": total if not a.device.startswith("cuda") else a.gpu_memory and total})).buckets[0]
                t_meas = time.perf_counter() - t0
                shape = Shape.of_bucket(b.max_duration, b.max_tokens)
                est_at_meas = fitted_model(model, mode).peak(meas.batch_size, shape)
                mp = meas.extra["oom_peak_bytes"] or 0
                rows.append((f"{model}:{mode}", b.index, b.max_duration, b.max_tokens, meas.batch_size, est.batch_size,
                             mp, est_at_meas, meas.extra["oom_step_seconds"], t_meas, t_est))
                print(f"  {entry} bucket {b.index}: measured {meas.batch_size} in {t_meas:.0f} s, estimated "
                      f"{est.batch_size} in {t_est:.1f} s", flush=True)
    print()
    print("model:mode                       bucket  max_s    max_tok  bs_meas  bs_est  peak_meas_GiB  peak_est_GiB  est/meas  step_s")
    ratios = []
    for r in rows:
        ratio = r[7] / r[6] if r[6] else math.nan
        ratios.append(ratio)
        print(f"{r[0]:32s} {r[1]:6d}  {r[2]:7.3f}  {r[3]:7d}  {r[4]:7d}  {r[5]:6d}  {r[6] / 2**30:13.3f}  "
              f"{r[7] / 2**30:12.3f}  {ratio:8.3f}  {r[8]:.3f}")
    if ratios:
        print(f"median est/meas {float(np.nanmedian(ratios)):.3f}  worst |1 - est/meas| "
              f"{float(np.nanmax(np.abs(1 - np.array(ratios)))):.3f}  total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
