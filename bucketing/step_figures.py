"""What a layout of steps achieves and what no layout of the same batches can beat.

:func:`plan_report` measures any (steps, ranks) layout: fill, mean batch, straggler (predicted
step time max ÷ mean - 1, :class:`bucketing.costmodel.CostModel`, seconds), idle share, same-
bucket steps and the padded-seconds balance. :func:`spread_bound` and :func:`steps_over_bound`
are lower bounds over every layout of given per-batch values in steps of ``world_size``: what
``benchmarks/bench_fill.py --goals`` prints beside the achieved figures; :func:`step_warnings`
says where a plan will be poor (few steps an epoch, ranks the corpus cannot fill). Pure NumPy, no I/O.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bucketing.costmodel import CostModel
from manifests.plan_meta import StepsReport as PlanReport


def plan_report(bucket: npt.NDArray[np.integer], size: npt.NDArray[np.integer], max_duration: npt.NDArray[np.floating],
                max_tokens: npt.NDArray[np.integer], batch_sizes: npt.NDArray[np.integer],
                cost: CostModel | None = None, speed: npt.NDArray[np.floating] | None = None) -> PlanReport:
    """Report of a (steps, ranks) layout: every argument but ``batch_sizes`` (per bucket) is a
    (steps, ranks) matrix of the batches (rank-major plans: ``x.reshape(W, S).T``). ``speed``:
    each rank's relative speed (its times divided by it; None: all alike)."""
    cost = cost or CostModel()
    b = np.asarray(bucket)
    sz = np.asarray(size, dtype=np.float64)
    if b.size == 0:
        return PlanReport(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    times = cost.step_time(sz, max_duration, max_tokens)
    if speed is not None:
        times = times / np.asarray(speed, dtype=np.float64)[None, :]
    tmax, tmean = times.max(1), times.mean(1)
    padded = sz * np.asarray(max_duration, dtype=np.float64)
    ratio = padded.max(1) / np.maximum(padded.mean(1), 1e-12)
    return PlanReport(
        steps=int(b.shape[0]),
        fill=float(sz.sum() / np.asarray(batch_sizes, dtype=np.float64)[b].sum()),
        mean_batch=float(sz.mean()),
        straggler=float((tmax / tmean).mean() - 1.0),
        idle=float(1.0 - times.sum() / (b.shape[1] * tmax.sum())),
        same_bucket=float((b == b[:, :1]).all(1).mean()),
        balance_mean=float(ratio.mean()),
        balance_over_1_10=float((ratio > 1.10).mean()),
    )


def spread_bound(values: npt.ArrayLike, world_size: int) -> float:
    """Lower bound on the mean over steps of max ÷ mean - 1 for any layout of ``values`` (one
    per batch: predicted seconds or padded seconds; ``S x world_size`` of them) in ``S`` steps
    of ``world_size``. What no layout of these batches can beat (e.g. the straggler goal).

    The ``j``-th largest step maximum is at least the ``((j - 1) W + 1)``-th largest value
    (``j - 1`` steps cannot hold the ``(j - 1) W + 1`` largest), so the steps' maxima sum to at
    least ``M``; no step sums to more than the ``W`` largest values (``top``); hence
    ``sum_s (W max_s - sum_s) / sum_s >= (W M - total) / top``.
    """
    W = int(world_size)
    x = _whole_steps(values, W)[::-1]
    S = x.shape[0] // W
    top = float(x[:W].sum())
    return max(0.0, (W * float(x[::W].sum()) - float(x.sum())) / (S * max(top, 1e-12)))


def _whole_steps(values: npt.ArrayLike, W: int) -> npt.NDArray[np.float64]:
    """``values`` sorted ascending; ValueError unless they fill one or more steps of ``W``."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    if x.shape[0] == 0 or x.shape[0] % W:
        raise ValueError(f"{x.shape[0]} values do not fill steps of {W}")
    return x


def steps_over_bound(values: npt.ArrayLike, world_size: int, limit: float) -> int:
    """Lower bound on the steps whose max ÷ mean exceeds ``limit`` (> 1) in any layout of
    ``values`` (one per batch, ``S x world_size`` of them) in steps of ``world_size``.

    A step whose smallest batch is ``p`` and largest ``m`` has max ÷ mean at least
    ``W m / ((W - 1) m + p)``, so it stays within ``limit`` only if ``m <= limit p / D``,
    ``D = W - limit (W - 1)`` (no such bound when ``D <= 0``: from 11 ranks at 1.10). For each
    ``k``, the steps within the limit that hold one of the ``k`` smallest values hold only values
    up to the cap of the ``k``-th: at most ``W floor(n_k / W)`` of those ``k``, ``n_k`` the values
    under that cap; the rest, ``W`` at most per step, are in steps over the limit.
    """
    W = int(world_size)
    D = W - float(limit) * (W - 1)
    x = _whole_steps(values, W)
    if D <= 0:
        return 0
    n = np.searchsorted(x, float(limit) * x / D * (1.0 + 1e-12), side="right")
    k = np.arange(1, x.shape[0] + 1)
    left = np.maximum(k - W * (n // W), 0)
    return max(int((-(-left // W)).max()), -(-_without_company(x, W, float(limit)) // W))


def _without_company(x: npt.NDArray[np.float64], W: int, limit: float) -> int:
    """How many of the ``2 W`` smallest of ``x`` (sorted ascending) are over ``limit`` in every
    step of ``W`` that holds them: each such value puts its step over, and a step holds ``W``.

    For a value ``p`` and a step maximum ``x[j]``, max / mean is least with the ``W - 1`` largest
    values up to ``x[j]`` beside ``p`` (the consecutive run ending at ``j``, ``p``'s own index
    skipped); ``p`` has no company when every ``j`` leaves it over ``limit``. An
    (``2 W``, n) array comparison."""
    n = x.shape[0]
    if W < 2:
        return 0
    cs = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(min(n, 2 * W))[:, None]
    j = np.arange(W - 1, n)[None, :]  # the step's maximum, a run of W - 1 ending there beside p
    inside = (i >= j - W + 2) & (i <= j)  # p's index in the run: one value more below it
    company = np.where(inside, cs[j + 1] - cs[np.maximum(j - W + 1, 0)] - x[i], cs[j + 1] - cs[j - W + 2])
    ratio = W * np.maximum(x[j], x[i]) / np.maximum(x[i] + company, 1e-300)
    return int((ratio.min(1) > limit * (1.0 + 1e-12)).sum())


__all__ = ["PlanReport", "plan_report", "spread_bound", "steps_over_bound"]


#: an epoch of fewer steps than this makes a poor plan (warned): each step weighs much of the epoch
MIN_STEPS_PER_EPOCH = 20
#: a predicted straggler above this is warned: ranks wait that much of a step for the slowest
MAX_STRAGGLER = 0.15


def step_warnings(world_size: int, steps: int, straggler: float | None = None) -> list[str]:
    """One-line warnings where a plan of ``steps`` steps an epoch on ``world_size`` ranks will be
    poor: few steps an epoch (below :data:`MIN_STEPS_PER_EPOCH`), a predicted straggler above
    :data:`MAX_STRAGGLER` (the corpus cannot fill the ranks with batches of one length)."""
    out = []
    if steps < MIN_STEPS_PER_EPOCH:
        fits = world_size * steps // MIN_STEPS_PER_EPOCH
        advice = (f"about {fits} rank(s) at most give {MIN_STEPS_PER_EPOCH}+ steps" if fits >= 1
                  else f"the corpus holds too few batches for {MIN_STEPS_PER_EPOCH} steps on any world size")
        out.append(f"world size {world_size}: only {steps} step(s) an epoch, so each step is "
                   f"{1 / max(steps, 1):.0%} of it (learning-rate schedules, checkpoints and these figures rest "
                   f"on few steps); {advice}, or add data")
    if straggler is not None and straggler > MAX_STRAGGLER:
        out.append(f"world size {world_size}: predicted straggler {straggler:.0%}: ranks wait about that share of "
                   "each step for the slowest, as the corpus cannot fill this many ranks with batches of one "
                   "length; plan for fewer ranks or a larger corpus")
    return out


def steps_rows_warnings(rows: list[dict[str, float]]) -> list[str]:
    """:func:`step_warnings` of each world size of ``padding --world-sizes`` rows
    (:func:`bucketing.steps_report.steps_rows`), from its last (balanced) row."""
    last = {int(r["world_size"]): r for r in rows}
    return [w for W, r in last.items() for w in step_warnings(W, int(r["steps"]), float(r["straggler"]))]
