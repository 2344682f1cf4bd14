"""Packed plans against 2D bucketing on the same corpus, in the same run.

    python benchmarks/bench_pack.py [--data ../shared/data] [--rows N] [--pack 2048] [--world-size 8]

Speech: LibriSpeech train-clean-100 and Common Voice id/ps (../shared/data; tokens as
bench_buckets.py: a 1024-piece sentencepiece model on their transcripts + 9 prompt tokens),
30x2 buckets fitted for 600 s of padded audio per batch. Text-only: the same transcripts as
rows of duration 0 (num_tokens from that tokenizer), the text corpus a speech-LLM blend adds.
Prints, for the 2D plan of the speech rows and the packed plans (speech alone, and speech +
text) at ``--pack`` token-equivalents (``--audio-token-rate`` 12.5/s): slot use in
token-equivalents (1 - padding), audio and token padding, plan time per utterance (median
of ``--repeats`` runs after an untimed one) and the ratio to 2D's, and a step's balance (predicted straggler, steps over the tolerance).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_buckets import BUDGET, load  # noqa: E402
from bucketing.fit_passes import fit_spec  # noqa: E402
from bucketing.packing import DEFAULT_AUDIO_TOKEN_RATE, token_equivalents  # noqa: E402
from dataprep.planning import PlanOptions, build_plan  # noqa: E402
from manifests.buckets_file import write_buckets  # noqa: E402
from manifests.manifest_write import write_manifest  # noqa: E402
from manifests.plan_files import open_shard  # noqa: E402


def manifest(path: Path, d: np.ndarray, t: np.ndarray) -> Path:
    n = d.shape[0]
    write_manifest(pl.DataFrame({"id": [f"r{i}" for i in range(n)], "audio_path": [f"a/{i}.flac" for i in range(n)],
                                 "duration": d, "text": "x", "lang": "en", "num_tokens": t,
                                 "tps": t / np.maximum(d, 1e-9), "origin": "bench"}), path)
    return path


def te_slot_use(plan: Path, world: int, te: np.ndarray, rate: float, d: np.ndarray, t: np.ndarray) -> float:
    """Share of te slots a plan's batches fill: packed, the sequences' N each; 2D, each batch
    padded to its longest audio and most tokens (size x (ceil(longest x rate) + most))."""
    real = slots = 0
    for r in range(world):
        table = open_shard(plan, r).read(columns=["rows", "size", "cu_seqlens"] if "cu" in plan.name else
                                         ["rows", "size"])
        rows = pc.list_flatten(table.column("rows")).to_numpy()
        real += int(te[rows].sum())
        size = table.column("size").to_numpy().astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(size)[:-1]])
        if "cu" in plan.name:
            n_seq = pc.list_value_length(table.column("cu_seqlens")).to_numpy() - 1
            slots += int(n_seq.sum()) * PACK
        else:
            longest = np.maximum.reduceat(d[rows], starts)
            most = np.maximum.reduceat(t[rows], starts)
            slots += int((size * (token_equivalents(longest, most, rate))).sum())
    return real / slots


def plan(man: Path, buckets: Path, out: Path, options: PlanOptions, rows: int, repeats: int) -> tuple[dict, float]:
    """The plan's metadata and the median wall time per row (us) over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        meta = build_plan(man, buckets, out, options)
        times.append(time.perf_counter() - t0)
    return meta.to_json(), statistics.median(times) / rows * 1e6


PACK = 2048


def synthetic(n: int, world: int, pack: int, rate: float, repeats: int) -> None:
    """Plan time per row of a synthetic corpus of ``n`` rows, 2D vs packed."""
    from dataprep.testing import write_plan_inputs

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kept, buckets = write_plan_inputs(root, n, seed=0, num_buckets=30, budget=BUDGET)
        build_plan(kept, buckets, root / "warm-up", PlanOptions(world_size=world))
        _, us2 = plan(kept, buckets, root / "2d", PlanOptions(world_size=world), n, repeats)
        meta, usp = plan(kept, buckets, root / "packed", PlanOptions(world_size=world, pack=pack,
                                                                     audio_token_rate=rate), n, repeats)
        print(f"synthetic {n:,} rows: plan time 2D {us2:.2f} us/row, packed {usp:.2f} us/row ({usp / us2:.2f}x); "
              f"packed slot use {meta['pack']['slot_use']:.2%}")


def main() -> None:
    global PACK
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--rows", type=int, default=None, help="each corpus's first rows only (a toy run)")
    ap.add_argument("--pack", type=int, default=PACK)
    ap.add_argument("--audio-token-rate", type=float, default=DEFAULT_AUDIO_TOKEN_RATE)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per plan (median), after one untimed")
    ap.add_argument("--synthetic-rows", type=int, default=0,
                    help="also time 2D vs packed plans of this many synthetic rows (dataprep.testing.write_plan_inputs, "
                         "30x2 buckets for 600 s)")
    args = ap.parse_args()
    PACK, rate, W = args.pack, args.audio_token_rate, args.world_size
    corpora = load(args.data, rows=args.rows)
    d = np.concatenate([c[0] for c in corpora.values()])
    t = np.concatenate([c[1] for c in corpora.values()])
    spec, _ = fit_spec(d, t, num_buckets=30, num_subbuckets=2, max_duration_budget=BUDGET)
    text_t = t.copy()  # the transcripts again, as text-only rows (duration 0)
    bd, bt = np.concatenate([d, np.zeros(text_t.shape[0])]), np.concatenate([t, text_t])
    print(f"speech: {d.shape[0]:,} rows, {d.sum() / 3600:.1f} h; text-only: {text_t.shape[0]:,} rows "
          f"(the transcripts, num_tokens from the sentencepiece model); N = {PACK} token-equivalents, "
          f"{rate:g} audio tokens/s")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        speech, blend = manifest(root / "speech.parquet", d, t), manifest(root / "blend.parquet", bd, bt)
        write_buckets(spec, root / "buckets.json")
        base = PlanOptions(world_size=W)
        build_plan(speech, root / "buckets.json", root / "warm-up", base)  # imports, hash caches: untimed
        runs = [("2D buckets (speech)", speech, "plan-2d", base, d, t),
                ("packed (speech)", speech, "plan-cu-speech", PlanOptions(world_size=W, pack=PACK,
                                                                         audio_token_rate=rate), d, t),
                ("packed (speech + text)", blend, "plan-cu-blend", PlanOptions(world_size=W, pack=PACK,
                                                                              audio_token_rate=rate), bd, bt)]
        header = (f"{'plan':<24} {'rows':>8} {'slot use (te)':>13} {'pad audio':>9} {'pad tokens':>10} "
                  f"{'us/row':>7} {'x 2D':>5} {'straggler':>9} {'unbalanced':>10}")
        print(header)
        base_us = None
        for name, man, out, options, dd, tt in runs:
            meta, us = plan(man, root / "buckets.json", root / out, options, dd.shape[0], args.repeats)
            base_us = us if base_us is None else base_us
            te = token_equivalents(dd, tt, rate)
            use = te_slot_use(root / out, W, te, rate, dd, tt)
            bal = meta.get("balance", {})
            print(f"{name:<24} {dd.shape[0]:>8,} {use:>13.2%} {meta['padding']['audio']:>9.2%} "
                  f"{meta['padding']['tokens']:>10.2%} {us:>7.2f} {us / base_us:>5.2f} "
                  f"{bal.get('straggler', 0):>9.2%} {bal.get('unbalanced_steps', 0) / max(meta['num_steps'], 1):>10.2%}")
    if args.synthetic_rows:
        synthetic(args.synthetic_rows, W, PACK, rate, args.repeats)
    print("packed rows: pad tokens = padding of token-equivalents in sequences of N; pad audio = members x "
          "the batch's longest audio. straggler: mean over steps of the slowest rank's predicted time over the "
          "mean - 1; unbalanced: steps over the balance tolerance (0.05)")


if __name__ == "__main__":
    main()
