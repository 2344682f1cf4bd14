"""Dynamic-resolution benchmark: frame padding with dynamic resolution vs today's audio padding.

    python benchmarks/bench_dynres.py [--data ../shared/data] [--seeds 3] [--max-rates 130,120,150]

On LibriSpeech train-clean-100 and Common Voice id/ps (../shared/data), tokens as in
bench_buckets.py (a 1024-piece sentencepiece model on their transcripts + 9 prompt tokens),
30x2 buckets fitted by `fit_spec` with a padded budget of 600 s per batch, batches formed as
`dataprep padding` and the planner form them (carried tails, default grouping). For each
corpus and each max rate (min 70 Hz, floor 50 Hz, base 100 Hz):

- `2d audio`: today's audio padding (1 - real s / (batch size x longest s));
- `2d frames`: the same in frames at the base rate (what the encoder sees);
- `dynres frames`: frame padding left with dynamic resolution (clamped utterances only);
- `clamped`: share of utterances whose rate hit the clamp; `fell back`: share of batches;
- `off >10%`: share of real frames at a rate more than 10% off the base rate (the price:
  features the model sees at another resolution than at evaluation).

Figures are medians over --seeds batch-forming seeds. Goal (issue 16): dynres frames <= 0.5%.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from bench_buckets import BUDGET, CORPORA, load  # noqa: E402
from bucketing.allocate import fit_spec  # noqa: E402
from bucketing.dynres import DynResConfig  # noqa: E402
from bucketing.fit import grid_from_spec  # noqa: E402
from bucketing.padding import padding_report  # noqa: E402

LABELS = {"librispeech.train-clean-100.csv": "LibriSpeech 100 h", "commonvoice.id_ps.csv": "Common Voice id+ps"}


def measure(d: np.ndarray, t: np.ndarray, cfg: DynResConfig, seeds: int) -> dict[str, float]:
    """Medians over seeds of the 2D and 2D + dynamic-resolution figures (ratios)."""
    spec, _ = fit_spec(d, t, num_buckets=30, num_subbuckets=2, max_duration_budget=BUDGET)
    grid = grid_from_spec(spec)
    sizes = np.array([b.batch_size for b in spec.buckets])
    runs = []
    for s in range(seeds):
        rep = padding_report(d, t, grid, sizes, budget=BUDGET, seed=s, fixed_lengths=(), dynamic_resolution=cfg)
        two, dyn = rep["schemes"]["2d"], rep["schemes"]["2d-dynamic-resolution"]
        runs.append({"2d audio": two["audio_padding"], "2d frames": dyn["frame_padding_base"],
                     "dynres frames": dyn["frame_padding"], "clamped": dyn["clamped_share"],
                     "fell back": dyn["fallback_share"], "off >10%": dyn["off_rate_share"],
                     "worst bucket": max(b["dynres_frame_padding"] for b in rep["per_bucket"])})
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-rates", default="130,120,150", help="Max rates (Hz) to compare; the first is the default.")
    args = ap.parse_args()
    corpora = load(args.data)
    cols = ["2d audio", "2d frames", "dynres frames", "clamped", "fell back", "off >10%", "worst bucket"]
    print(f"30x2 buckets, {BUDGET:g} s padded per batch, base 100 Hz, min 70 Hz, floor 50 Hz; "
          f"medians over {args.seeds} seeds")
    print(f"| corpus | rows | max rate (Hz) | {' | '.join(cols)} |")
    print("|---|---:|---:|" + "---:|" * len(cols))
    for name in CORPORA:
        d, t = corpora[name]
        for mr in (float(x) for x in args.max_rates.split(",")):
            m = measure(d, t, DynResConfig(max_rate=mr), args.seeds)
            print(f"| {LABELS[name]} | {d.shape[0]:,} | {mr:g} | " + " | ".join(f"{100 * m[c]:.2f}%" for c in cols) + " |")


if __name__ == "__main__":
    main()
