"""Command: calibrate (fit the step-time cost model from a run's step log). The work is in
:mod:`dataprep.planning.calibrate`."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer

from bucketing.costmodel import CostModel
from dataprep.cli.app import app, out, user_errors
from dataprep.cli.fmt import Table, pct, plural
from manifests.outputs import refuse_same_paths


@app.command("calibrate")
@user_errors
def calibrate_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="The plan the run trained on.")],
    log: Annotated[Path, typer.Argument(help="Step log (Parquet): rank, step and step_s (or forward_backward_s + optimizer_s) seconds per rank and step, data_wait_s optional; or a folder of them (dataprep train's checkpoint folder: steps-rank-*.parquet).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="costmodel.json to write (plan-batches / replan --cost-model read it).")],
    frame_shift: Annotated[float, typer.Option("--frame-shift", help="Seconds per audio frame of the model (not fitted).")] = CostModel().frame_shift,
) -> None:
    """Fit the cost model (seconds per batch from its size, padded frames and tokens) to the
    step times a run measured, and each rank's speed beside it; print how well it explains
    them. plan-batches --cost-model / replan --cost-model then balance steps by measured cost."""
    from dataprep.planning.calibrate import calibrate, write_calibration

    refuse_same_paths({"PLAN": plan_dir, "LOG": log}, {"-o": output})
    cal = calibrate(plan_dir, log, frame_shift)
    write_calibration(cal, plan_dir, log, output)
    out.print(f"calibrated on {plural(cal.rows, 'rank-step')}: median error {pct(cal.median_rel_error)}, "
              f"p90 {pct(cal.p90_rel_error)}" + ("" if cal.data_wait_share is None
                                                 else f"; data wait {pct(cal.data_wait_share)} of step time"),
              markup=False)
    coefs = Table(title="cost model (seconds per batch)", title_justify="left")
    for f in fields(CostModel):
        coefs.add_column(f.name, justify="right")
    coefs.add_row(*[f"{getattr(cal.cost, f.name):.4g}" for f in fields(CostModel)])
    out.print(coefs)
    logged = [(r, s) for r, s in enumerate(cal.rank_speed) if s is not None]
    if logged:
        slow = max(logged, key=lambda p: p[1])
        fast = min(logged, key=lambda p: p[1])
        out.print(f"rank speed (measured / predicted, median rank 1.00): slowest rank {slow[0]} {slow[1]:.2f}, "
                  f"fastest rank {fast[0]} {fast[1]:.2f}", markup=False)
    buckets = Table(title="per bucket: median step time", title_justify="left")
    for name in ("bucket", "batches", "measured s", "predicted s"):
        buckets.add_column(name, justify="right")
    for b in cal.per_bucket:
        buckets.add_row(str(b["bucket"]), f"{b['batches']:,}", f"{b['measured_s']:.4f}", f"{b['predicted_s']:.4f}")
    out.print(buckets)
    out.print(f"wrote {output}", markup=False)
