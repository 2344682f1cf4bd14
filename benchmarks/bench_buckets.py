"""Bucketing benchmark: our padding vs Lhotse + NeMo's 2D constraint, and fitting time.

    python benchmarks/bench_buckets.py [--data ../shared/data] [--rows 10000000] [--repeats 3]

On LibriSpeech train-clean-100 and Common Voice id/ps (../shared/data), tokens from a
1024-piece sentencepiece model trained on their transcripts + 9 prompt tokens, 30x2 buckets,
600 s of padded audio per batch, prints the padding of: ours (`fit_spec` with outlier fences
and `form_batches`; also the plain shuffle, window=1, and the grid without fences); Lhotse's
`DynamicBucketingSampler` with NeMo's `FixedBucketBatchSizeConstraint2D` logic (re-stated here:
NeMo is not a dependency; bins as NeMo estimates them from the first 10k cuts, batch size
floor(600 / bin duration), rows no bucket holds dropped). Then the median time to fit 30x2
buckets on --rows synthetic rows. Medians over --repeats seeds (padding) / runs (timing).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bucketing.allocate import allocate, carry_tails  # noqa: E402
from bucketing.batching import form_batches  # noqa: E402
from bucketing.fit import grid_from_spec  # noqa: E402
from bucketing.fit_passes import fit_buckets, fit_spec  # noqa: E402
from bucketing.padding import measure  # noqa: E402

CORPORA = ("librispeech.train-clean-100.csv", "commonvoice.id_ps.csv")
BUDGET = 600.0


def load(data: Path, seed: int = 1234, rows: int | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(durations in s, tokens) per corpus; ``rows``: only each corpus's first rows (a toy run)."""
    import sentencepiece as spm

    frames = {n: pl.read_csv(data / n, infer_schema_length=0, n_rows=rows).with_columns(pl.col("duration").cast(pl.Float64))
              for n in CORPORA}
    texts = [x for df in frames.values() for x in df["text"].drop_nulls().to_list()]
    buf = io.BytesIO()
    # as tests/conftest.py; training still varies a little run to run (thread timing), so
    # token counts, hence both sides' figures, move by a few hundredths of a point
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, vocab_size=1024, model_type="unigram",
        character_coverage=1.0, input_sentence_size=20000, shuffle_input_sentence=True,
        num_threads=2, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    out = {}
    for n, df in frames.items():
        t = np.array([len(p) for p in sp.encode(df["text"].fill_null("").to_list())], dtype=np.int64) + 9
        out[n] = (df["duration"].to_numpy(), t)
    return out


@dataclass
class Row:
    audio: float
    tokens: float
    mean_batch: float
    batches: int
    dropped: int
    buckets: int = 0
    moved: int = 0


def ours(d: np.ndarray, t: np.ndarray, seeds: int, fences: bool = True, carry: bool = True, **opts) -> Row:
    off = {} if fences else {"outlier_fence": None, "token_fence": None}
    spec, alloc = fit_spec(d, t, num_buckets=30, num_subbuckets=2, max_duration_budget=BUDGET, **off)
    sizes = np.array([b.batch_size for b in spec.buckets])
    grid = grid_from_spec(spec)
    bucket = allocate(d, t, grid).bucket  # bucket tails carried on as the planner and `dataprep padding` do
    if carry:
        bucket = carry_tails(bucket, d, t, sizes, grid.max_tokens, grid.duration_bin)[0]
    ps = [measure(form_batches(bucket, sizes, np.random.default_rng([s, 0]), t, duration=d, **opts), d, t)
          for s in range(seeds)]
    return Row(statistics.median(p.audio_padding for p in ps), statistics.median(p.token_padding for p in ps),
               statistics.median(p.mean_batch_size for p in ps), int(statistics.median(p.num_batches for p in ps)),
               alloc.num_dropped, len(spec.buckets), alloc.moved)


def nemo_bins(d: np.ndarray, t: np.ndarray) -> list[tuple[float, int]]:
    """NeMo-style 2D bins from the first 10k rows: Lhotse duration bins, equal-count token sub-bins."""
    from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets

    class _C:  # estimate_duration_buckets only reads .duration
        def __init__(self, x: float) -> None:
            self.duration = x

    ds, ts = d[:10_000], t[:10_000]
    bounds = estimate_duration_buckets([_C(x) for x in ds], num_buckets=30) + [float(ds.max())]
    bins: list[tuple[float, int]] = []
    lo = -np.inf
    for hi in bounds:
        sel = np.sort(ts[(ds > lo) & (ds <= hi)])
        if sel.shape[0]:
            cand = [int(sel[int(np.ceil(sel.shape[0] * k / 2)) - 1]) for k in (1, 2)]
            for c in sorted(set(cand)):
                bins.append((float(hi), c))
        lo = hi
    return bins


def lhotse_side(d: np.ndarray, t: np.ndarray, seeds: int) -> Row:
    from bisect import bisect_left

    from lhotse import MonoCut, SupervisionSegment
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.dataset.sampling.dynamic_bucketing import FixedBucketBatchSizeConstraint

    bins = nemo_bins(d, t)
    arr = np.asarray(bins)

    class Constraint2D(FixedBucketBatchSizeConstraint):
        """NeMo's FixedBucketBatchSizeConstraint2D, strict 2D (find_smallest_bucket)."""

        def measure_length(self, example):  # type: ignore[override]
            return example.duration, example.custom["num_tokens"]

        def select_bucket(self, buckets, example=None, example_len=None):  # type: ignore[override]
            dl, tl = self.measure_length(example) if example_len is None else example_len
            b0 = bisect_left(arr[:, 0].tolist(), dl)
            if b0 == arr.shape[0]:
                return None
            e0 = b0
            while e0 < arr.shape[0] and arr[e0, 0] == arr[b0, 0]:
                e0 += 1
            b1 = bisect_left(arr[b0:e0, 1].tolist(), tl)
            return None if b1 == e0 - b0 else b0 + b1

    sizes = [max(1, int(np.floor(BUDGET / b[0] + 1e-9))) for b in bins]
    cuts = []
    probe = Constraint2D(max_seq_len_buckets=[b[0] for b in bins], batch_sizes=sizes)
    dropped = 0
    for i in range(d.shape[0]):
        c = MonoCut(id=f"c{i}", start=0.0, duration=float(d[i]), channel=0,
                    supervisions=[SupervisionSegment(id=f"c{i}", recording_id=f"r{i}", start=0.0,
                                                     duration=float(d[i]))],
                    custom={"num_tokens": int(t[i]), "row": i})
        if probe.select_bucket(None, example_len=(d[i], t[i])) is None:
            dropped += 1  # NeMo's bucketing filter drops what no bucket holds
            continue
        cuts.append(c)
    rows = []
    for s in range(seeds):
        con = Constraint2D(max_seq_len_buckets=[b[0] for b in bins], batch_sizes=sizes)
        sampler = DynamicBucketingSampler(cuts, constraint=con, duration_bins=[tuple(b) for b in bins],
                                          shuffle=True, seed=s)
        real_d = pad_d = real_t = pad_t = 0.0
        n = nb = 0
        for batch in sampler:
            dd = np.array([c.duration for c in batch])
            tt = np.array([c.custom["num_tokens"] for c in batch])
            real_d += dd.sum(); pad_d += dd.max() * len(dd)
            real_t += tt.sum(); pad_t += tt.max() * len(tt)
            n += len(dd); nb += 1
        rows.append(Row(1 - real_d / pad_d, 1 - real_t / pad_t, n / nb, nb, dropped, len(bins)))
    return Row(statistics.median(r.audio for r in rows), statistics.median(r.tokens for r in rows),
               statistics.median(r.mean_batch for r in rows), int(statistics.median(r.batches for r in rows)), dropped,
               len(bins))


def fit_time(n: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    d = np.round(rng.gamma(4, 2.5, n) + 0.5, 3)
    t = (d * rng.uniform(2, 5, n)).astype(np.int64) + 9
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit_buckets(d, t, 30, 2)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spm-seed", type=int, default=1234, help="seed of the tokenizer's sentence sampling")
    args = ap.parse_args()
    if all((args.data / n).exists() for n in CORPORA):
        data = load(args.data, args.spm_seed)
        print(f"30x2 buckets, padded budget {BUDGET:g} s per batch, medians over {args.repeats} seeds")
        print(f"{'corpus':<16}{'method':<34}{'audio pad':>10}{'token pad':>10}{'mean batch':>11}{'batches':>9}"
              f"{'dropped':>8}{'buckets':>8}{'moved':>7}")
        for name, (d, t) in data.items():
            short = name.split(".")[0]
            for label, row in (
                ("ours (default)", ours(d, t, args.repeats)),
                ("ours (no carried tails)", ours(d, t, args.repeats, carry=False)),
                ("ours (no fences)", ours(d, t, args.repeats, fences=False)),
                ("ours (plain shuffle, window=1)", ours(d, t, args.repeats, window=1)),
                ("lhotse DynamicBucketing + 2D", lhotse_side(d, t, args.repeats)),
            ):
                print(f"{short:<16}{label:<34}{100 * row.audio:>9.2f}%{100 * row.tokens:>9.2f}%"
                      f"{row.mean_batch:>11.1f}{row.batches:>9}{row.dropped:>8}{row.buckets:>8}{row.moved:>7}")
    else:
        print(f"skipping the padding comparison: {args.data} not found")
    print(f"fit 30x2 on {args.rows:,} synthetic rows: {fit_time(args.rows, args.repeats):.2f} s (median of {args.repeats})")


if __name__ == "__main__":
    main()
