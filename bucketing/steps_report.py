"""Fill and balance of the steps a plan would have at a world size, before planning.

Pure core: rows (durations s, tokens), the bucket grid and batch sizes in; per world size, one
epoch planned in memory with :func:`bucketing.plan.plan_epoch` (one bucket per step, and
balanced steps at a tolerance) and its :class:`bucketing.step_figures.PlanReport`, the packing bound
and padding out; :func:`steps_rows` measures the epochs of any planner (the out-of-core one
too: ``dataprep padding --world-sizes``). Used by ``benchmarks/bench_fill.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.allocate import assign
from bucketing.balance import DEFAULT_BALANCE
from bucketing.step_figures import PlanReport, plan_report
from bucketing.costmodel import CostModel
from bucketing.fit import Grid
from bucketing.plan import EpochPlan, PlanInputs, plan_epoch


def epoch_report(ep: EpochPlan, batch_sizes: npt.ArrayLike, cost: CostModel | None = None,
                 speed: npt.NDArray[np.floating] | None = None) -> PlanReport:
    """:func:`bucketing.step_figures.plan_report` of one planned epoch (rank-major arrays);
    ``speed``: each rank's relative speed."""
    W, S = ep.world_size, ep.num_steps

    def m(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return x.reshape(W, S).T

    return plan_report(m(ep.bucket_of_batch()), m(ep.sizes()), m(ep.max_duration), m(ep.max_tokens),
                       np.asarray(batch_sizes), cost, speed)


def plan_in_memory(duration: npt.ArrayLike, num_tokens: npt.ArrayLike, grid: Grid, batch_sizes: npt.ArrayLike,
                   world_size: int, balance: float, *, seed: int = 0, strict: bool = False, carry: bool = True,
                   cost: CostModel | None = None) -> EpochPlan:
    """Epoch 0 as ``plan-batches`` would plan it (same allocation and carry rule)."""
    d = np.asarray(duration, dtype=np.float64)
    t = np.asarray(num_tokens, dtype=np.int64)
    bs = np.asarray(batch_sizes, dtype=np.int64)
    a = assign(d, t, grid, bs, strict=strict, carry=carry, world_size=None if balance > 0 else world_size)
    inp = PlanInputs(a.bucket, bs, d, t, grid.max_duration, a.max_tokens.astype(np.float64))
    return plan_epoch(inp, world_size, seed, 0, balance=balance, cost=cost)


def steps_report(duration: npt.ArrayLike, num_tokens: npt.ArrayLike, grid: Grid, batch_sizes: npt.ArrayLike,
                 world_sizes: list[int], balance: float = DEFAULT_BALANCE, *, seed: int = 0, strict: bool = False,
                 carry: bool = True, cost: CostModel | None = None) -> list[dict[str, Any]]:
    """:func:`steps_rows` of epochs planned in memory (:func:`plan_in_memory`)."""
    cost = cost or CostModel()

    def plan(W: int, tol: float) -> EpochPlan:
        return plan_in_memory(duration, num_tokens, grid, batch_sizes, W, tol, seed=seed, strict=strict, carry=carry,
                              cost=cost)

    return steps_rows(plan, world_sizes, balance, batch_sizes, cost)


def steps_rows(plan: Callable[[int, float], EpochPlan], world_sizes: list[int], balance: float,
               batch_sizes: npt.ArrayLike, cost: CostModel) -> list[dict[str, Any]]:
    """Per world size and planner (``balance`` 0 and the given tolerance): steps, ``fill``
    (mean batch ÷ mean batch at W = 1), ``bound`` (B / (W ⌈B / W⌉), B = batches at W = 1), the
    report's straggler / same-bucket / balance figures, padding and dropped rows. ``plan(W,
    tolerance)``: epoch 0 at that world size and balance tolerance, as ``plan-batches`` plans
    it (in memory, or out of core: only per-batch figures are read, never ``rows``)."""
    one = plan(1, max(balance, 0.0))
    B, mean1 = one.num_steps, float(one.sizes().mean())
    out = []
    for W in world_sizes:
        for tol in dict.fromkeys([0.0, balance]):
            ep = plan(W, tol)
            rep = epoch_report(ep, batch_sizes, cost)
            out.append({"world_size": W, "balance": tol, **rep.to_json(),
                        "fill": round(rep.mean_batch / mean1, 6), "fill_of_batch_sizes": round(rep.fill, 6),
                        "bound": round(B / (W * math.ceil(B / W)), 6),
                        "padding_audio": round(ep.audio_padding, 6), "padding_tokens": round(ep.token_padding, 6),
                        "dropped": int(ep.dropped.shape[0])})
    return out
