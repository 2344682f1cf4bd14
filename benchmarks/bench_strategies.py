"""SYNC, ADPSGD and HYBRID on plans made for them: one epoch under the step-time cost model,
with and without a 1.5x slow learner.

    python benchmarks/bench_strategies.py                     # shared corpora + 10M synthetic, W = 16, 32, 128
    python benchmarks/bench_strategies.py --synthetic-rows 0 --worlds 16

Plans (30x2 buckets, padded budget 600 s, seed 0, ``--balance`` as given, default 0): SYNC on
``--sync-group W``, ADPSGD on ``--sync-group 1``, HYBRID on ``--sync-group 8`` (groups of 8 ranks
synchronized, ADPSGD between groups). Simulation (``bucketing.simulate.simulate_strategy``):
SYNC waits for the slowest rank every step; ADPSGD learners sit on a ring and each step ends
with one exchange (``--exchange`` s) with the next learner, which must have finished the
previous step; HYBRID is SYNC inside a group, ADPSGD between groups. ``slow``: rank 0's batches
take 1.5x. Columns: epoch seconds, utterances/s, idle share, staleness (steps).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_fill import bench_corpora  # noqa: E402
from bucketing.budget import padded_budget_batch_sizes  # noqa: E402
from bucketing.costmodel import CostModel  # noqa: E402
from bucketing.fit_passes import fit_buckets  # noqa: E402
from bucketing.groups import regroup  # noqa: E402
from bucketing.simulate import simulate_strategy  # noqa: E402
from bucketing.steps_report import plan_in_memory  # noqa: E402

PLANS = (("sync", None), ("adpsgd", 1), ("hybrid", 8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="16,32,128")
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--balance", type=float, default=0.0)
    ap.add_argument("--exchange", type=float, default=0.005)
    ap.add_argument("--slow", type=float, default=1.5)
    ap.add_argument("--synthetic-rows", type=int, default=10_000_000)
    args = ap.parse_args()
    cost = CostModel()
    corpora = bench_corpora(args.synthetic_rows)
    print(f"--balance {args.balance:g}, exchange {args.exchange:g} s, slow = rank 0 x{args.slow:g}; cost model {cost}")
    print("| corpus | W | strategy (plan) | epoch s | utt/s | idle | staleness | slow: epoch s | utt/s | idle | staleness |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in corpora:
        fit = fit_buckets(c.duration, c.tokens, 30, 2)
        bs = padded_budget_batch_sizes(fit.grid.max_duration, max_duration_budget=args.budget)
        for W in (int(w) for w in args.worlds.split(",")):
            base = plan_in_memory(c.duration, c.tokens, fit.grid, bs, W, args.balance, cost=cost)
            for strategy, G in PLANS:
                ep = regroup(base, G or W, seed=0)
                S = ep.num_steps
                t = cost.step_time(ep.sizes(), ep.max_duration, ep.max_tokens).reshape(W, S).T
                sizes = ep.sizes().reshape(W, S).T
                cells = []
                for slow in (None, {0: args.slow}):
                    r = simulate_strategy(t, sizes, strategy, G, args.exchange, slow)
                    cells += [f"{r.time:.1f}", f"{r.utt_per_s:.0f}", f"{r.idle:.1%}", str(r.staleness)]
                label = f"{strategy} (--sync-group {G or W})"
                print(f"| {c.name} | {W} | {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
