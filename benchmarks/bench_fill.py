"""Fill and balance of plans at fine-tuning scale: identical-bucket steps (``--balance 0``),
balanced steps (``--balance 0.05``) and Lhotse's ``DynamicBucketingSampler(sync_buckets=True)``
side by side at the same world size, the same buckets and batch sizes, the same cost model.

    python benchmarks/bench_fill.py                       # LibriSpeech 100 h, Common Voice id+ps, 10M synthetic
    python benchmarks/bench_fill.py --synthetic-rows 0 --lhotse-max-world 32
    python benchmarks/bench_fill.py --synthetic-rows 0 --lhotse-max-world 0 --worlds 8,32 --cost-equal --goals

Prints one row per corpus, world size and policy: ``steps``, ``fill`` / ``bound``, ``bal``,
``>1.10``, ``strag``, ``same`` (share of steps whose ranks all draw one bucket), ``pad a/t``,
``drop`` (utterances not trained; the other columns and the goals: docs/benchmarks.md).
``--cost-equal`` adds rows with cost-equal batch sizes; ``--goals`` each balanced row's goals
met / unmet and their lower bounds; ``--seeds N`` medians over seeds; ``--baseline REF`` the rows
planned by git ``REF``'s code. Lhotse's steps: the fewest batches any rank's sampler yields.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
LIB = Path(os.environ.get("BENCH_FILL_LIB", REPO))  # the library planned with (--baseline: an older one)
sys.path.insert(0, str(LIB))
sys.path.insert(0, str(LIB / "benchmarks"))

from bench_plan import CORPORA, PROMPT, SHARED, synthetic  # noqa: E402
from bucketing.step_figures import plan_report  # noqa: E402

try:
    from bucketing.step_figures import spread_bound, steps_over_bound
except ImportError:  # --baseline: a library older than the bounds (none printed)
    spread_bound = steps_over_bound = None
from bucketing.budget import cost_equal_batch_sizes, padded_budget_batch_sizes  # noqa: E402
from bucketing.costmodel import CostModel  # noqa: E402
from bucketing.fit_passes import fit_buckets  # noqa: E402
from bucketing.steps_report import plan_in_memory, steps_report  # noqa: E402


@dataclass
class Corpus:
    name: str
    duration: np.ndarray
    tokens: np.ndarray


def shared_corpora() -> list[Corpus]:
    """LibriSpeech 100 h and Common Voice id+ps with sentencepiece token counts."""
    import io

    import sentencepiece as spm

    frames = {n: pl.read_csv(SHARED / n, columns=["duration", "text"]).drop_nulls() for n in CORPORA}
    texts = [t for df in frames.values() for t in df["text"].to_list()]
    buf = io.BytesIO()
    # every k-th transcript (about 20,000), not sentencepiece's own sampling: its draws vary
    # from run to run even when seeded, and with them every figure of the table
    sample = texts[::max(1, len(texts) // 20000)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sample), model_writer=buf, vocab_size=1024,
                                   input_sentence_size=0, shuffle_input_sentence=False, num_threads=2,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    out = []
    for n, label in zip(CORPORA, ("LibriSpeech 100 h", "Common Voice id+ps")):
        df = frames[n]
        tok = np.array([len(p) for p in sp.encode(df["text"].to_list())], dtype=np.int64) + PROMPT
        out.append(Corpus(label, df["duration"].to_numpy().astype(np.float64), tok))
    return out


def bench_corpora(synthetic_rows: int) -> list[Corpus]:
    """The shared corpora (when ../shared/data has them) and, with ``synthetic_rows``, a
    synthetic one of that many rows (:func:`bench_plan.synthetic`)."""
    corpora = shared_corpora() if all((SHARED / n).exists() for n in CORPORA) else []
    if synthetic_rows:
        df = synthetic(synthetic_rows)
        corpora.append(Corpus(f"synthetic {synthetic_rows / 1e6:g}M", df["duration"].to_numpy(),
                              df["num_tokens"].to_numpy().astype(np.int64)))
    return corpora


def row(label: str, r: dict) -> str:
    return (f"| {label} | {r['world_size']} | {r['steps']} | {r['fill']:.3f} | {r['bound']:.3f} | "
            f"{r['balance_mean']:.3f} | {r['balance_over_1_10']:.1%} | {r['straggler']:.1%} | {r['same_bucket']:.1%} | "
            f"{r['padding_audio']:.2%} / {r['padding_tokens']:.2%} | {r['dropped']} |")


#: Issue 22's balance goals: (name, figure, limit, "<=" or ">=").
GOALS = (("bal", "balance_mean", 1.05), (">1.10", "balance_over_1_10", 0.02), ("strag", "straggler", 0.02))


def goals(r: dict) -> str:
    """One line: each goal of a balanced row, met or unmet."""
    parts = [f"{name} {r[key]:.3f} <= {lim:g} {'met' if r[key] <= lim else 'UNMET'}" for name, key, lim in GOALS]
    lim = 0.97 * r["bound"]
    parts.append(f"fill {r['fill']:.3f} >= 0.97 bound {lim:.3f} {'met' if r['fill'] >= lim - 1e-9 else 'UNMET'}")
    return "|  goals: " + "; ".join(parts) + " |"


def over_seeds(c: Corpus, fit, bs: np.ndarray, W: int, args, cost: CostModel) -> str:
    """One line: a balanced row planned with seeds 0 .. ``args.seeds - 1``: the goal checks met
    (of three per seed) and the median of each goal's figure."""
    rows = [r for seed in range(args.seeds)
            for r in steps_report(c.duration, c.tokens, fit.grid, bs, [W], args.balance, cost=cost, seed=seed)
            if r["balance"] > 0]
    met = sum(r[key] <= lim for r in rows for _, key, lim in GOALS)
    med = "; ".join(f"{name} {float(np.median([r[key] for r in rows])):.3f}" for name, key, _ in GOALS)
    return f"|  seeds 0-{args.seeds - 1}: goal checks met {met} of {3 * len(rows)}; medians {med} |"


def bounds(c: Corpus, fit, bs: np.ndarray, W: int, tolerance: float, cost: CostModel) -> str:
    """One line: what no layout of this plan's batches can beat (its epoch's batches, any steps
    of W: :func:`bucketing.step_figures.spread_bound`, :func:`bucketing.step_figures.steps_over_bound`)."""
    ep = plan_in_memory(c.duration, c.tokens, fit.grid, bs, W, tolerance, cost=cost)
    sizes = ep.sizes()
    pad = sizes * ep.max_duration
    t = cost.step_time(sizes, ep.max_duration, ep.max_tokens)
    over = steps_over_bound(pad, W, 1 + 2 * tolerance)
    by_step = t.reshape(W, ep.num_steps)  # rank-major: column s is step s
    epoch_s = float(by_step.max(0).sum())
    return (f"|  bounds (any layout of these batches): bal >= {1 + spread_bound(pad, W):.3f}; "
            f">1.10 >= {over} of {ep.num_steps} steps ({over / ep.num_steps:.1%}); strag >= {spread_bound(t, W):.3f}; "
            f"this layout: predicted epoch {epoch_s:.1f} s (sum of step maxima), "
            f"idle {1 - float(t.sum()) / (W * epoch_s):.2%} |")


def save_corpora(corpora: list[Corpus], path: Path) -> None:
    """The corpora (names, durations, tokens) in one ``.npz``, for :func:`load_corpora`."""
    arrays = {f"{k}_{i}": getattr(c, k) for i, c in enumerate(corpora) for k in ("duration", "tokens")}
    np.savez(path, names=np.array([c.name for c in corpora]), **arrays)


def load_corpora(path: Path) -> list[Corpus]:
    with np.load(path) as z:
        return [Corpus(str(n), z[f"duration_{i}"], z[f"tokens_{i}"]) for i, n in enumerate(z["names"])]


def run_baseline(ref: str, corpora: list[Corpus]) -> None:
    """Rerun this script (without --baseline) against the library of git ``ref``, on the same
    corpora (passed in a file: ``ref``'s own benchmarks may generate or tokenize them otherwise)."""
    argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--baseline" and (i == 0 or sys.argv[i] != "--baseline")]
    argv = [a for a in argv if not a.startswith("--baseline=")]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        # the shared data stays where this checkout finds it (the archive's own default is beside it)
        env = {**os.environ, "BENCH_FILL_LIB": tmp, "PYTHONPATH": tmp}
        save_corpora(corpora, Path(tmp) / "corpora.npz")
        subprocess.run([sys.executable, __file__, *argv, "--label", f" [{ref}]", "--corpora-file",
                        str(Path(tmp) / "corpora.npz")], env=env, check=True)


def lhotse_steps(c: Corpus, grid, bs: np.ndarray, W: int, cost: CostModel):
    from lhotse import CutSet
    from lhotse.dataset.sampling import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    from dataprep.integrations.export import lhotse_constraint

    bins = [[float(d), int(t)] for d, t in zip(grid.max_duration, grid.max_tokens)]
    cuts = []
    for i, (d, t) in enumerate(zip(c.duration.tolist(), c.tokens.tolist())):
        cut = dummy_cut(i, duration=d)
        cut.custom = {"num_tokens": int(t)}
        cuts.append(cut)
    cuts = CutSet.from_cuts(cuts)
    constraint = lhotse_constraint(bins, bs.tolist())
    per_rank = []
    for r in range(W):
        s = DynamicBucketingSampler(cuts, constraint=lhotse_constraint(bins, bs.tolist()), duration_bins=bins,
                                    shuffle=True, seed=0, world_size=W, rank=r, sync_buckets=True)
        batches = []
        for b in s:
            d = np.array([x.duration for x in b])
            t = np.array([x.custom["num_tokens"] for x in b])
            batches.append((len(b), d.max(), t.max(), d.sum(), t.sum(),
                            constraint.select_bucket(None, example_len=(float(d.max()), int(t.max())))))
        per_rank.append(np.array(batches, dtype=np.float64))
    S = min(x.shape[0] for x in per_rank)
    arr = np.stack([x[:S] for x in per_rank], axis=1)  # (S, W, 6)
    total = sum(int(x[:, 0].sum()) for x in per_rank)
    kept = int(arr[..., 0].sum())
    pad = (1 - arr[..., 3].sum() / (arr[..., 0] * arr[..., 1]).sum(),
           1 - arr[..., 4].sum() / (arr[..., 0] * arr[..., 2]).sum())
    bucket = np.minimum(arr[..., 5].astype(np.int64), bs.shape[0] - 1)
    rep = plan_report(bucket, arr[..., 0], arr[..., 1], arr[..., 2].astype(np.int64), bs, cost)
    return rep, pad, c.duration.shape[0] - kept, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="8,32,128")
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--balance", type=float, default=0.05)
    ap.add_argument("--synthetic-rows", type=int, default=10_000_000)
    ap.add_argument("--synthetic-worlds", default="128,1024")
    ap.add_argument("--lhotse-max-world", type=int, default=128, help="skip Lhotse above this W (0 = never)")
    ap.add_argument("--cost-equal", action="store_true", help="also plan with cost-equal batch sizes")
    ap.add_argument("--goals", action="store_true",
                    help="print each balanced row's goals as met / unmet, and the bounds no layout of its batches beats")
    ap.add_argument("--seeds", type=int, default=1,
                    help="also plan each balanced row with seeds 0..N-1: goal checks met of 3N and median figures")
    ap.add_argument("--baseline", default=None, metavar="REF", help="also plan with the library of git REF")
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    ap.add_argument("--corpora-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cost = CostModel()
    if args.corpora_file:  # --baseline's rerun: the corpora this checkout made
        corpora = load_corpora(Path(args.corpora_file))
    else:
        corpora = bench_corpora(args.synthetic_rows)
    worlds = {True: [int(w) for w in args.worlds.split(",")], False: [int(w) for w in args.synthetic_worlds.split(",")]}
    jobs = [(c, worlds[not c.name.startswith("synthetic")], not c.name.startswith("synthetic")) for c in corpora]
    print(f"30x2 buckets, padded budget {args.budget:.0f} s, seed 0, one epoch; cost model {cost}")
    print("| corpus / planner | W | steps | fill | bound | bal | >1.10 | strag | same | pad a / t | drop |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, worlds, with_lhotse in jobs:
        fit = fit_buckets(c.duration, c.tokens, 30, 2)
        caps = padded_budget_batch_sizes(fit.grid.max_duration, max_duration_budget=args.budget)
        for sizing in (("budget", "cost-equal") if args.cost_equal else ("budget",)):
            bs = caps if sizing == "budget" else cost_equal_batch_sizes(fit.grid.max_duration, fit.grid.max_tokens,
                                                                        caps, cost)[0]
            label = (c.name if sizing == "budget" else f"{c.name} cost-equal") + args.label
            run_corpus(c, label, fit, bs, worlds, with_lhotse and sizing == "budget", args, cost)
    if args.baseline:
        run_baseline(args.baseline, corpora)


def run_corpus(c: Corpus, label: str, fit, bs: np.ndarray, worlds: list[int], with_lhotse: bool, args,
               cost: CostModel) -> None:
    mean1 = None
    for W in worlds:
        t0 = time.perf_counter()
        rows = steps_report(c.duration, c.tokens, fit.grid, bs, [1, W] if mean1 is None else [W], args.balance,
                            cost=cost)
        mean1 = rows[0]["mean_batch"] / rows[0]["fill"]
        for r in rows:
            if r["world_size"] == W:
                print(row(f"{label} --balance {r['balance']:g}", r) + f" {time.perf_counter() - t0:.1f} s",
                      flush=True)
                if args.goals and r["balance"] > 0:
                    print(goals(r), flush=True)
                    if spread_bound is not None:
                        print(bounds(c, fit, bs, W, args.balance, cost), flush=True)
                if args.seeds > 1 and r["balance"] > 0:
                    print(over_seeds(c, fit, bs, W, args, cost), flush=True)
        if with_lhotse and 0 < W <= args.lhotse_max_world:
            t0 = time.perf_counter()
            rep, pad, dropped, _ = lhotse_steps(c, fit.grid, bs, W, cost)
            bound = rows[-1]["bound"]
            r = {"world_size": W, **rep.to_json(), "fill": rep.mean_batch / mean1, "bound": bound,
                 "padding_audio": pad[0], "padding_tokens": pad[1], "dropped": dropped}
            print(row(f"{c.name} Lhotse sync_buckets", r) + f" {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
