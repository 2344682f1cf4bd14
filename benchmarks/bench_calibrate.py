"""Calibration benchmark: ``dataprep calibrate`` on a step log of many logged rank-steps.

    python benchmarks/bench_calibrate.py [--rows 500000] [--world-size 8] [--epochs 10] [--repeats 3]

Plans ``--rows`` synthetic utterances (``dataprep.testing.write_plan_inputs``) for ``--world-size``
ranks and ``--epochs`` epochs, writes a step log of every rank's every step timed by a known cost
model (one rank 1.4x slower, 2% noise), and prints the median wall time of
:func:`dataprep.planning.calibrate.calibrate` over ``--repeats`` runs (goal: 10^5 logged steps in
<= 10 s), with how well it recovered the model (median error of its predictions against the known
model's, and the slow rank's speed).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bucketing.costmodel import CostModel  # noqa: E402
from dataprep.planning.build import build_plan  # noqa: E402
from dataprep.planning.calibrate import calibrate  # noqa: E402
from dataprep.planning.options import PlanOptions  # noqa: E402
from dataprep.testing import write_plan_inputs  # noqa: E402
from manifests.plan_files import PlanShard  # noqa: E402

TRUE = CostModel(overhead=0.05, per_frame=3e-6, per_frame2=1e-9, per_token=4e-5, per_token2=1e-7)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manifest, buckets = write_plan_inputs(root, args.rows, seed=0, num_buckets=30)
        plan = root / "plan"
        build_plan(manifest, buckets, plan, PlanOptions(world_size=args.world_size, epochs=args.epochs))
        rng = np.random.default_rng(0)
        frames, shapes = [], []
        for r in range(args.world_size):
            t = PlanShard(plan, r).read(columns=["step", "size", "max_duration", "max_tokens"])
            sec = TRUE.step_time(t["size"].to_numpy(), t["max_duration"].to_numpy(), t["max_tokens"].to_numpy())
            shapes.append(sec)
            speed = 1.4 if r == args.world_size - 1 else 1.0
            frames.append(pl.DataFrame({"rank": np.full(sec.shape[0], r), "step": t["step"].to_numpy(),
                                        "step_s": sec * speed * (1 + rng.normal(0, 0.02, sec.shape[0]))}))
        log = root / "steps.parquet"
        pl.concat(frames).write_parquet(log)
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            cal = calibrate(plan, log)
            walls.append(time.perf_counter() - t0)
        truth = shapes[0]
        t = PlanShard(plan, 0).read(columns=["size", "max_duration", "max_tokens"])
        got = cal.cost.step_time(t["size"].to_numpy(), t["max_duration"].to_numpy(), t["max_tokens"].to_numpy())
        print(f"step log: {cal.rows:,} rank-steps ({args.world_size} ranks, {args.epochs} epochs of {args.rows:,} rows)")
        print(f"calibrate: median {statistics.median(walls):.2f} s over {args.repeats} runs (goal: 10^5 rank-steps <= 10 s)")
        print(f"recovered: predictions within {np.median(np.abs(got - truth) / truth):.2%} of the known model (median); "
              f"slow rank at {cal.rank_speed[-1]:.3f} (true 1.400); fit error median {cal.median_rel_error:.2%}")


if __name__ == "__main__":
    main()
