"""Balanced steps: fill every step with full batches whose predicted times agree.

Pure core (arrays in, an :class:`bucketing.plan.EpochPlan` out), used by
:func:`bucketing.plan.plan_epoch` when ``balance > 0``; :func:`plan_report` measures any plan.

What synchronization must guarantee is that the ``W`` batches of a step take about the same
time, not that they come from one bucket. How one epoch is planned:

1. Batches are formed per bucket exactly as the identical-bucket planner forms them (same rng),
   and each gets a predicted time (:class:`bucketing.costmodel.CostModel`, seconds).
2. Batches (and the pieces of step 3) are ordered by cost class (log time in steps of ``tolerance / 2``), then bucket,
   then time. Consecutive runs of ``W`` in that order are the steps: a step spans at most
   about two neighbouring classes (max / min time within about ``1 + tolerance``) and mixes
   buckets only where a bucket's batches in that class run out (same-bucket steps where the
   data allows).
3. With ``N`` batches and ``t = N mod W > 0``, the last step has ``W - t`` free slots: the
   ``W - t`` heaviest batches (of at least 2 utterances) are halved inside their buckets,
   which narrows the top of the cost range. Where too few batches can be halved, the ``t``
   cheapest (with ``g`` more whole steps' worth when they hold fewer than ``W`` utterances)
   are cut into ``(g + 1) W`` pieces, the pieces per batch in proportion to its time. These
   pieces (``split_batches``) are the only batches below their bucket's size; steps per epoch
   = ``ceil(N / W)`` (the packing bound) unless ``g > 0``. Pieces join the order of step 2.
4. Steps whose max / mean predicted time (of the batches as laid out) exceeds
   ``1 + tolerance`` are counted (``unbalanced_steps``); nothing is moved for them. Steps are shuffled
   (``interleave="random"``) or kept in ascending time; ranks inside a step are shuffled.

Invariants (tests check): every allocated row exactly once per epoch; every batch non-empty,
at most its bucket's batch size, all its rows in that bucket; equal steps on every rank;
equal inputs give equal arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bucketing.batching import gather_segments
from bucketing.costmodel import CostModel
from manifests.plan_meta import StepsReport as PlanReport


@dataclass(frozen=True)
class BalancedSteps:
    """One epoch's balanced layout over the formed batches' rows (before interleaving).

    ``seg_offsets`` refine the formed batches' CSR (tail batches cut into pieces);
    ``seg_step`` / ``seg_bucket`` give each segment's step (0 .. S-1, ascending time) and bucket;
    ``split_batches`` counts the formed batches cut into pieces.
    """

    seg_offsets: npt.NDArray[np.int64]
    seg_step: npt.NDArray[np.int64]
    seg_bucket: npt.NDArray[np.int32]
    num_steps: int
    split_batches: int


def batch_cost(cost: CostModel, sizes: npt.NDArray[np.integer], offsets: npt.NDArray[np.int64],
               rows: npt.NDArray[np.int64], durations: npt.NDArray[np.floating],
               num_tokens: npt.NDArray[np.integer]) -> npt.NDArray[np.float64]:
    """Predicted seconds per CSR batch (its size, longest duration, most tokens)."""
    if sizes.shape[0] == 0:
        return np.empty(0)
    starts = offsets[:-1]
    max_d = np.maximum.reduceat(np.asarray(durations, dtype=np.float64)[rows], starts)
    max_t = np.maximum.reduceat(np.asarray(num_tokens, dtype=np.int64)[rows], starts)
    return cost.step_time(sizes, max_d, max_t)


def _pieces_per_batch(work: npt.NDArray[np.float64], sizes: npt.NDArray[np.int64], parts: int) -> npt.NDArray[np.int64]:
    """Pieces per batch, ``1 <= m <= size``, summing to ``parts``, about proportional to ``work``
    (largest ``work / m`` gets the next piece). Needs ``len(work) <= parts <= sizes.sum()``."""
    w = np.maximum(work, 1e-12)
    m = np.clip(np.floor(parts * w / w.sum()).astype(np.int64), 1, sizes)
    # at most len(work) + parts corrections, one piece each: a loop over a step's ranks
    while m.sum() < parts:
        score = np.where(m < sizes, w / m, -np.inf)
        m[int(np.argmax(score))] += 1
    while m.sum() > parts:
        score = np.full(m.shape[0], np.inf)
        np.divide(w, m - 1, out=score, where=m > 1)
        m[int(np.argmin(score))] -= 1
    return m


def balance_steps(bucket: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64], cost: npt.NDArray[np.float64],
                  world_size: int, tolerance: float, overhead: float) -> BalancedSteps | None:
    """Group formed batches (``bucket``, CSR ``offsets``, predicted ``cost`` s) into steps of
    ``world_size`` (module docstring, steps 2-4). None when the rows cannot fill whole steps
    without merging batches (fewer utterances than steps x ranks)."""
    W = int(world_size)
    N = int(bucket.shape[0])
    sizes = np.diff(offsets)
    m = np.ones(N, dtype=np.int64)  # pieces per batch
    t = N % W
    if t:
        # the W - t free slots of the last step go to the heaviest splittable batches (halved),
        # which narrows the top of the cost range; else the t cheapest (with g more whole
        # steps' worth when they hold too few rows) are cut into (g + 1) W pieces by their time
        heavy = np.flatnonzero(sizes >= 2)
        if heavy.shape[0] >= W - t:
            top = heavy[np.lexsort((-np.arange(heavy.shape[0]), cost[heavy]))[::-1][:W - t]]
            m[top] = 2
        else:
            by_cost = np.lexsort((np.arange(N), cost))
            cs = np.cumsum(sizes[by_cost])
            g = np.arange((N - t) // W + 1)
            ok = np.flatnonzero(cs[t + g * W - 1] >= (g + 1) * W)
            if ok.shape[0] == 0:
                return None
            tail = by_cost[:t + int(ok[0]) * W]
            m[tail] = _pieces_per_batch(cost[tail] - overhead, sizes[tail], (int(ok[0]) + 1) * W)
    # pieces: contiguous near-equal cuts of each batch (inside its bucket), in row order
    P = int(m.sum())
    parent = np.repeat(np.arange(N, dtype=np.int64), m)
    first = np.repeat(np.cumsum(m) - m, m)
    k = np.arange(P, dtype=np.int64) - first
    base, extra = np.divmod(sizes[parent], m[parent])
    piece = base + (k < extra)
    seg_offsets = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(piece, out=seg_offsets[1:])
    seg_cost = overhead + (cost[parent] - overhead) * piece / sizes[parent]
    seg_bucket = bucket[parent].astype(np.int32)
    # cost classes of relative width tolerance / 2: a step spanning two neighbouring classes
    # stays within about 1 + tolerance; inside a class, batches of one bucket stay together
    key = np.floor(np.log(np.maximum(seg_cost, 1e-12)) / np.log1p(tolerance / 2)).astype(np.int64)
    order = np.lexsort((np.arange(P), seg_cost, seg_bucket, key))
    S = P // W
    seg_step = np.empty(P, dtype=np.int64)
    seg_step[order] = np.repeat(np.arange(S, dtype=np.int64), W)
    return BalancedSteps(seg_offsets, seg_step, seg_bucket, S, int((m > 1).sum()))


def layout(steps: BalancedSteps, world_size: int, rng_steps: np.random.Generator | None,
           rng_ranks: np.random.Generator) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Rank-major layout of balanced steps: (CSR offsets, index into the formed rows, bucket per
    batch). ``rng_steps`` shuffles the steps (None keeps ascending time); ``rng_ranks`` deals
    each step's batches to ranks."""
    W, S = int(world_size), steps.num_steps
    n = S * W
    pos = rng_steps.permutation(S) if rng_steps is not None else np.arange(S)  # step -> position
    within = np.lexsort((rng_ranks.random(n), steps.seg_step))  # segments grouped by step, shuffled inside
    rank = np.empty(n, dtype=np.int64)
    rank[within] = np.tile(np.arange(W, dtype=np.int64), S)
    order = np.empty(n, dtype=np.int64)
    order[rank * S + pos[steps.seg_step]] = np.arange(n, dtype=np.int64)
    offsets, gather = gather_segments(steps.seg_offsets, order)
    return offsets, gather, steps.seg_bucket[order]


def plan_report(bucket: npt.NDArray[np.integer], size: npt.NDArray[np.integer], max_duration: npt.NDArray[np.floating],
                max_tokens: npt.NDArray[np.integer], batch_sizes: npt.NDArray[np.integer],
                cost: CostModel | None = None) -> PlanReport:
    """Report of a (steps, ranks) layout: every argument but ``batch_sizes`` (per bucket) is a
    (steps, ranks) matrix of the batches (rank-major plans: ``x.reshape(W, S).T``)."""
    cost = cost or CostModel()
    b = np.asarray(bucket)
    sz = np.asarray(size, dtype=np.float64)
    if b.size == 0:
        return PlanReport(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    times = cost.step_time(sz, max_duration, max_tokens)
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
