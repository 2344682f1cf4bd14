"""Dynamic-resolution benchmark: a constant frame budget per batch (F) against 2D bucketing,
each with batch sizes made for its own shape, and feature throughput at a fractional hop.

    python benchmarks/bench_dynres.py [--data ../shared/data] [--targets 800,1000,1200,1600] [--seeds 1]

On LibriSpeech train-clean-100 and Common Voice id/ps, 30x2 buckets fitted by `fit_spec`, batch
sizes of the canary-1b estimate at 80 GiB for each policy's shape, prints per policy: `encoder
frames` (batch size x batch length summed over the epoch, relative to 2D; goal at F = 1000 on
LibriSpeech <= 0.80), `mean batch` relative to 2D (goal >= 1.25), `frame padding`, `off >10%`
(share of real frames at a rate more than 10% off 100 Hz), `clamped` (utterances) and `fell
back` (batches). Then feature extraction (Canary-1B front end, CPU): audio s/s at a fractional
hop against NeMo's fixed hop on the same batch, median of --repeats (goal >= 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_buckets import CORPORA, load  # noqa: E402
from bench_plan import SHARED  # noqa: E402
from bucketing.fit_passes import fit_spec  # noqa: E402
from bucketing.dynres import DynResConfig, resolve  # noqa: E402
from bucketing.fit import grid_from_spec  # noqa: E402
from bucketing.padding import padding_report  # noqa: E402
from dataprep.training.features import FeatureConfig, LogMel  # noqa: E402
from oom.optimize import oomptimize  # noqa: E402
from oom.options import OomOptions  # noqa: E402

LABELS = {"librispeech.train-clean-100.csv": "LibriSpeech 100 h", "commonvoice.id_ps.csv": "Common Voice id+ps"}
GPU = 80 * 2**30
MODEL = "canary-1b"


def sizes_for(spec, cfg: DynResConfig | None, model: str = MODEL) -> np.ndarray:  # type: ignore[no-untyped-def]
    """``model``'s estimate at 80 GiB, each bucket at its shape under ``cfg`` (None: 2D)."""
    sized = oomptimize(spec, OomOptions(model, estimate=True, gpu_memory=GPU, dynamic_resolution=cfg))
    return np.array([b.batch_size for b in sized.buckets], dtype=np.int64)


def measure(d: np.ndarray, t: np.ndarray, targets: list[int], seeds: int,
            model: str = MODEL) -> list[dict[str, float | str]]:
    """One row per policy (2D first), medians over batch-forming seeds."""
    spec, _ = fit_spec(d, t, num_buckets=30, num_subbuckets=2, max_duration_budget=600.0)
    grid = grid_from_spec(spec)
    rows: list[dict[str, float | str]] = []
    policies: list[tuple[str, DynResConfig | None]] = [("2d", None)] + [(f"F={f}", DynResConfig(target_frames=f))
                                                                        for f in targets]
    for name, cfg in policies:
        sizes = sizes_for(spec, cfg, model)
        runs = []
        for s in range(seeds):
            rep = padding_report(d, t, grid, sizes, seed=s, fixed_lengths=(),
                                 dynamic_resolution=cfg or DynResConfig())
            dyn = rep["schemes"]["2d-dynamic-resolution"]
            row = next(r for r in dyn["compare"] if r["policy"] == ("2d" if cfg is None else name))
            runs.append({k: float(row[k]) for k in ("encoder_frames", "mean_batch", "frame_padding", "off_rate_share",
                                                     "clamped_share", "fallback_share")})
        rows.append({"policy": name, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}})
    return rows


def throughput(repeats: int, seconds: float = 12.0, batch: int = 16, target: int = 1000) -> tuple[float, float]:
    """Audio seconds per wall second: (fixed hop, fractional hop), Canary-1B front end."""
    torch.manual_seed(0)
    mel = LogMel(FeatureConfig.canary_1b(dither=0.0))
    n = torch.randint(int(0.8 * seconds * 16000), int(seconds * 16000) + 1, (batch,))
    n[0] = int(seconds * 16000)
    x = torch.randn(batch, int(n.max())) * 0.1
    res = resolve(n.numpy() / 16000, np.array([0, batch]), np.array([target]), DynResConfig(target_frames=target))
    hops, frames = torch.from_numpy(res.hop()), torch.from_numpy(res.frames)
    audio = float(n.sum()) / 16000

    def rate(fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return audio / statistics.median(times)

    return rate(lambda: mel(x, n)), rate(lambda: mel.at_hops(x, n, hops, frames))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SHARED)  # ../shared/data or $SPEECH_DATAPREP_SHARED_DATA
    ap.add_argument("--targets", default="800,1000,1200,1600", help="Constant targets F (frames per batch).")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--model", default=MODEL, help="The model whose memory estimate sizes the batches.")
    ap.add_argument("--rows", type=int, default=None, help="Only each corpus's first rows (a toy run).")
    args = ap.parse_args()
    targets = [int(x) for x in args.targets.split(",")]
    torch.set_num_threads(1)
    corpora = load(args.data, rows=args.rows)
    print(f"30x2 buckets; sizes: {args.model} estimate at 80 GiB for each policy's shape; base 100 Hz, 70-130 Hz, "
          f"floor 50 Hz; medians over {args.seeds} seed(s)")
    cols = ["encoder frames vs 2D", "mean batch", "vs 2D", "frame padding", "off >10%", "clamped", "fell back"]
    print(f"| corpus | policy | {' | '.join(cols)} |")
    print("|---|---|" + "---:|" * len(cols))
    for name in CORPORA:
        d, t = corpora[name]
        rows = measure(d, t, targets, args.seeds, args.model)
        base = rows[0]
        for r in rows:
            print(f"| {LABELS[name]} | {r['policy']} | {r['encoder_frames'] / base['encoder_frames']:.3f} | "
                  f"{r['mean_batch']:.1f} | {r['mean_batch'] / base['mean_batch']:.2f}x | {r['frame_padding']:.2%} | "
                  f"{r['off_rate_share']:.1%} | {r['clamped_share']:.1%} | {r['fallback_share']:.1%} |")
    fixed, frac = throughput(args.repeats)
    print(f"features (Canary-1B front end, CPU, 1 thread, 16 x <=12 s): fixed hop {fixed:,.0f} audio s/s, "
          f"fractional hop (F = 1000) {frac:,.0f} audio s/s: {frac / fixed:.2f}x")


if __name__ == "__main__":
    main()
