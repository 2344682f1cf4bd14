"""Balanced steps: fill every step with near-full batches whose predicted times agree.

Pure core (arrays in, an :class:`bucketing.plan.EpochPlan` out), used by
:func:`bucketing.plan.plan_epoch` when ``balance > 0``; :func:`bucketing.step_figures.plan_report` measures any plan.
An epoch: batches formed per bucket, near-equal in size (:func:`bucketing.batching.even_batch_counts`),
each with a predicted time (:class:`bucketing.costmodel.CostModel`, seconds) and padded seconds;
same-bucket steps where ``W`` batches of a bucket agree within ``1 + tolerance``
(:func:`same_bucket_runs`); free slots filled by halving heavy batches or cutting cheap ones
(:func:`split_batches`); the rest ordered by time and padded seconds into mixed steps
(:func:`disperse_tail`, :func:`repair_steps`); epochs of at most :data:`SMALL_EPOCH` batches keep
the layout that meets the most goals (:func:`goals_unmet`, :func:`reach_goals`). Steps over
``1 + tolerance`` are counted (``unbalanced_steps``). docs/plans.md explains the design.
Invariants (tests check): every allocated row exactly once per epoch; every batch non-empty,
at most its bucket's batch size, all its rows in that bucket; equal steps on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np
import numpy.typing as npt

from bucketing.batching import gather_segments, run_positions
from bucketing.costmodel import CostModel

#: Default balance tolerance of ``plan-batches`` / :func:`dataprep.planning.build_plan` and of
#: ``padding --world-sizes``: relative spread (max ÷ mean - 1) of predicted step times allowed
#: in a step. 0 asks for one bucket per step instead.
DEFAULT_BALANCE: float = 0.05
#: Weight of the predicted-time spread against the padded-seconds spread when steps are evened
#: out (the straggler goal, 2%, is tighter than the padded one, 5%; measured with
#: benchmarks/bench_fill.py: 2 lowers the straggler at W = 32 by ~0.3 points, 4 gains nothing more).
COST_WEIGHT: float = 2.0
#: The cost spread's tolerance, as a share of the balance tolerance (the straggler goal, 2%, is
#: tighter than the padded one, 5%; bench_fill: 0.5 meets every goal at LibriSpeech W = 8 with
#: either sizing and cuts the straggler at W = 32 from 2.9-3.0% to 2.2-2.5%).
COST_TOL: float = 0.5
#: Epochs of at most this many batches (the few-step epochs of small corpora at large W) get
#: the full swap search: every batch of the worst step against every other step.
SMALL_EPOCH: int = 1024
#: Small epochs try this many of :func:`tail_layouts` (T = 0, W/8, W/4, W/2) per pairing order,
#: each repaired (bench_fill: the chosen one was always among them; all of them, ~8 an order,
#: gave the same plans in twice the time).
SMALL_TAILS: int = 4
#: Penalty of a step whose max / mean exceeds 1 + 2 x tolerance (1.10: the share of such steps
#: is a goal of its own), on top of the linear terms (bench_fill: 0.3 takes Common Voice W = 8
#: from 24% of steps over 1.10 to 4-8%; 1 gains nothing more).
STEP_JUMP: float = 0.3
#: Issue 22's goals, relative to the tolerance ``tol`` (0.05: straggler <= 2%, steps over 1.10
#: on <= 2% of steps): the mean straggler at most this share of ``tol``, and the share of steps
#: whose padded max / mean exceeds ``1 + 2 tol`` at most :data:`GOAL_STEPS_OVER`.
GOAL_STRAGGLER: float = 0.4
GOAL_STEPS_OVER: float = 0.02
#: Weight of log cost against log padded seconds in the order that pairs batches (3: the padded
#: goal met on LibriSpeech at W = 32 with the straggler at 2.9%; 1: 4.3%; cost alone: padded 1.05+).
KEY_COST_WEIGHT: float = 3.0
#: Swaps :func:`reach_goals` makes at most (bench_fill: LibriSpeech at W = 32 takes about 20).
REACH_ROUNDS: int = 64
#: Steps furthest from the goals whose batches :func:`reach_goals` tries each round.
REACH_STEPS: int = 4


@dataclass(frozen=True)
class BalancedSteps:
    """One epoch's balanced layout over the formed batches' rows (before interleaving).

    ``seg_offsets`` refine the formed batches' CSR (tail batches cut into pieces);
    ``seg_step`` / ``seg_bucket`` give each segment's step (0 .. S-1, ascending time) and bucket;
    ``split_batches`` counts the formed batches cut into pieces; ``same_bucket_runs`` the steps
    made of one bucket's whole batches by :func:`same_bucket_runs` (step 2).
    """

    seg_offsets: npt.NDArray[np.int64]
    seg_step: npt.NDArray[np.int64]
    seg_bucket: npt.NDArray[np.int32]
    num_steps: int
    split_batches: int
    same_bucket_runs: int = 0


def batch_cost(cost: CostModel, sizes: npt.NDArray[np.integer], offsets: npt.NDArray[np.int64],
               rows: npt.NDArray[np.int64], durations: npt.NDArray[np.floating],
               num_tokens: npt.NDArray[np.integer]) -> npt.NDArray[np.float64]:
    """Predicted seconds per CSR batch (its size, longest duration, most tokens)."""
    max_d, max_t = batch_extremes(offsets, rows, durations, num_tokens)
    return cost.step_time(sizes, max_d, max_t) if sizes.shape[0] else np.empty(0)


def batch_extremes(offsets: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], durations: npt.NDArray[np.floating],
                   num_tokens: npt.NDArray[np.integer]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Longest duration (s) and most tokens of each CSR batch."""
    if offsets.shape[0] <= 1:
        return np.empty(0), np.empty(0, np.int64)
    starts = offsets[:-1]
    return (np.maximum.reduceat(np.asarray(durations, dtype=np.float64)[rows], starts),
            np.maximum.reduceat(np.asarray(num_tokens, dtype=np.int64)[rows], starts))


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


def same_bucket_runs(bucket: npt.NDArray[np.integer], cost: npt.NDArray[np.float64], world_size: int,
                     tolerance: float) -> npt.NDArray[np.int64]:
    """Formed batches that make whole same-bucket steps: a ``(k, world_size)`` matrix of batch
    indices, one row per step.

    Each row is a run of ``world_size`` consecutive batches of one bucket in that bucket's
    order by predicted time (``cost``, seconds; ties by index) whose max ÷ mean is at most
    ``1 + tolerance``. Rows are disjoint and as many as possible per bucket: of all windows
    that qualify, the earliest is taken, then the earliest starting after it, and so on (for
    windows of one length this greedy is optimal). Vectorized: the greedy chain is followed by
    pointer doubling (``log2 k`` array steps), across all buckets at once.
    """
    W = int(world_size)
    N = int(bucket.shape[0])
    if N < W:
        return np.empty((0, W), dtype=np.int64)
    order = np.lexsort((np.arange(N), cost, bucket))
    c = cost[order]
    b = np.asarray(bucket)[order]
    cs = np.zeros(N + 1)
    np.cumsum(c, out=cs[1:])
    i = np.arange(N - W + 1)
    mean = (cs[i + W] - cs[i]) / W
    # a hair inside the tolerance, so rounding in the window sums never admits a step the
    # plan's own max / mean check (another summation order) would count as unbalanced
    ok = (b[i] == b[i + W - 1]) & (c[i + W - 1] <= (1.0 + tolerance) * mean * (1.0 - 1e-9))
    starts = np.flatnonzero(ok)
    m = int(starts.shape[0])
    if m == 0:
        return np.empty((0, W), dtype=np.int64)
    # next[j]: the first qualifying window starting at or after starts[j] + W (m: none); a
    # window never crosses buckets, so one chain over all buckets is each bucket's greedy
    jump = np.append(np.searchsorted(starts, starts + W), m)
    path = np.zeros(1, dtype=np.int64)
    while path[-1] != m:  # path holds next^0 .. next^(L-1) of the first window, jump = next^L
        path = np.concatenate([path, jump[path]])
        jump = jump[jump]
    first = starts[path[path < m]]
    return order[first[:, None] + np.arange(W, dtype=np.int64)]


def balance_steps(bucket: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64], cost: npt.NDArray[np.float64],
                  world_size: int, tolerance: float, overhead: float, *,
                  padded: npt.NDArray[np.float64] | None = None) -> BalancedSteps | None:
    """Group formed batches (``bucket``, CSR ``offsets``, predicted ``cost`` s; ``padded``:
    padded audio seconds, batch size x longest, balanced too when given) into steps of
    ``world_size`` (module docstring, steps 2-5). None when the rows cannot fill whole steps
    without merging batches (fewer utterances than steps x ranks)."""
    W = int(world_size)
    N = int(bucket.shape[0])
    sizes = np.diff(offsets)
    runs = same_bucket_runs(bucket, cost, W, tolerance)
    run_of = np.full(N, -1, dtype=np.int64)  # same-bucket step of a formed batch, -1: laid out by time
    run_of[runs] = np.arange(runs.shape[0], dtype=np.int64)[:, None]
    m = np.ones(N, dtype=np.int64)  # pieces per batch
    t = N % W  # the same for the batches outside the runs (whole steps of W)
    if t:
        # the W - t free slots of the last step go to the heaviest splittable batches (halved),
        # which narrows the top of the cost range; else the t cheapest (with g more whole
        # steps' worth when they hold too few rows) are cut into (g + 1) W pieces by their time
        heavy = np.flatnonzero((sizes >= 2) & (run_of < 0))
        if heavy.shape[0] < W - t and runs.shape[0]:
            # too few to halve outside the runs: no runs, so the runs never cost a step (the
            # steps stay ceil(N / W) wherever the layout without them reaches it)
            run_of[:] = -1
            runs = runs[:0]
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
    # pieces: contiguous near-equal cuts of each batch (inside its bucket), in row order;
    # per segment only what the layout needs (an epoch can hold ~20M batches)
    P = int(m.sum())
    split = int((m > 1).sum())
    parent = np.repeat(np.arange(N, dtype=np.int64), m)
    whole = sizes[parent]
    piece = whole.copy()
    cut_up = np.flatnonzero(m > 1)  # the few batches cut into pieces
    if cut_up.shape[0]:
        first = (np.cumsum(m) - m)[cut_up]
        segs = run_positions(first, m[cut_up])
        k = segs - np.repeat(first, m[cut_up])
        base, extra = np.divmod(np.repeat(sizes[cut_up], m[cut_up]), np.repeat(m[cut_up], m[cut_up]))
        piece[segs] = base + (k < extra)
    run_segs = (np.cumsum(m) - m)[runs]  # the runs' batches are whole: one segment each
    del m
    seg_offsets = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(piece, out=seg_offsets[1:])
    seg_cost = cost[parent]  # overhead + (cost - overhead) * piece / whole, in place
    seg_cost -= overhead
    seg_cost *= piece
    seg_cost /= whole
    seg_cost += overhead
    seg_bucket = bucket[parent].astype(np.int32)
    # the rest by predicted time: consecutive groups of W are the tightest steps left (the
    # same-bucket steps are the runs above; ordering by bucket here only widened the rest)
    R = int(runs.shape[0])
    step = run_of[parent]  # runs are whole batches: one segment each
    del run_of
    rest = np.flatnonzero(step < 0)
    seg_pad = None if padded is None else np.asarray(padded, dtype=np.float64)[parent] * piece / whole
    del parent, whole, piece
    keys = [seg_cost[rest]] if seg_pad is None else [_pair_key(seg_cost[rest], seg_pad[rest]), seg_cost[rest]]
    S = P // W
    if S > R:
        # steps from each order (pairing both measures; time alone)
        measures = [seg_cost] if seg_pad is None else [seg_cost, seg_pad]
        orders = [rest[np.lexsort((rest, key))] for key in keys]
        cands = [disperse_tail(o, S - R, W, seg_cost, seg_pad, tolerance) for o in orders]
        pens = [float(_penalty(m, measures, tolerance).sum()) for m in cands]
        mat = repair_steps(cands[int(np.argmin(pens))], seg_cost, seg_pad, tolerance)  # the order of least penalty
        if (S - R) * W <= SMALL_EPOCH:
            # few steps: one step is several % of the epoch, so the goals are weighed over the
            # epoch's steps: the first tail dealings of both orders, each repaired, replace that
            # layout where one meets the straggler goal, or as many goals and more (of those,
            # the one of least penalty)
            cands = [mat] + [repair_steps(m, seg_cost, seg_pad, tolerance)
                             for o in orders for m in islice(tail_layouts(o, S - R, W), SMALL_TAILS)]
            unmet = [goals_unmet(m, seg_cost, seg_pad, tolerance) for m in cands]
            pens = [float(_penalty(m, measures, tolerance).sum()) for m in cands]
            mat = cands[min(range(len(cands)), key=lambda i: (unmet[i][0], sum(unmet[i]), i > 0, pens[i], i))]
            mat = reach_goals(mat, seg_cost, seg_pad, tolerance, runs=run_segs)
        step[mat.reshape(-1)] = R + np.repeat(np.arange(S - R, dtype=np.int64), W)
    # steps numbered by ascending predicted time (total over the step's W batches; ties: runs first)
    rank = np.empty(S, dtype=np.int64)
    rank[np.lexsort((np.arange(S), np.bincount(step, weights=seg_cost, minlength=S)))] = np.arange(S)
    return BalancedSteps(seg_offsets, rank[step], seg_bucket, S, split, R)


def _pair_key(cost: npt.NDArray[np.float64], padded: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """One order for two measures: each one's log relative to its median, cost weighted
    :data:`KEY_COST_WEIGHT` (batches close in it are close in both where the two agree, e.g.
    batches of one bucket)."""
    if cost.shape[0] == 0:
        return cost
    return (KEY_COST_WEIGHT * np.log(np.maximum(cost, 1e-12) / max(float(np.median(cost)), 1e-12))
            + np.log(np.maximum(padded, 1e-12) / max(float(np.median(padded)), 1e-12)))


def _spread(v: npt.NDArray[np.float64], tolerance: float) -> npt.NDArray[np.float64]:
    """Penalty of steps whose max / mean is ``v``: ``v - 1``, plus 4x what exceeds the
    tolerance, plus :data:`STEP_JUMP` above twice the tolerance."""
    return (v - 1.0) + 4.0 * np.maximum(v - 1.0 - tolerance, 0.0) + STEP_JUMP * (v > 1.0 + 2 * tolerance)


def _penalty(mat: npt.NDArray[np.int64], measures: list[npt.NDArray[np.float64]],
             tolerance: float) -> npt.NDArray[np.float64]:
    """Per step (row of ``mat``): the sum over ``measures`` of :func:`_spread` of max / mean
    (cost first: weighted :data:`COST_WEIGHT`, at :data:`COST_TOL` of the tolerance)."""
    out = np.zeros(mat.shape[0])
    for i, m in enumerate(measures):
        v = m[mat]
        w, tol = (COST_WEIGHT, COST_TOL * tolerance) if i == 0 else (1.0, tolerance)
        out += w * _spread(v.max(1) / np.maximum(v.mean(1), 1e-12), tol)
    return out


def tail_layouts(order: npt.NDArray[np.int64], S: int, W: int) -> Iterator[npt.NDArray[np.int64]]:
    """Steps (``S`` x ``W`` batch indices, ascending level) from batches in ascending ``order``,
    one layout per tail size ``T``: the lowest ``T`` batches are dealt one by one to the steps
    from the highest level down (cycling), and the others fill the rest of each step
    consecutively (``T = 0``: consecutive groups of ``W``). ``T`` is 0, W/8, W/4, ..., doubling
    up to half the batches (ascending). Vectorized per layout; one layout at a time (each is
    as large as the epoch's batches).
    """
    n = S * W
    Ts = {0} | {max(1, (W << k) // 8) for k in range(64) if (W << k) // 8 <= n // 2}
    for T in sorted(Ts):
        if T == 0:
            yield order.reshape(S, W)
            continue
        k = np.full(S, T // S, dtype=np.int64)
        k[S - 1 - np.arange(T % S)] += 1  # the highest steps take one more
        room = W - k
        if (room < 1).any():
            break
        # tail t (ascending) goes to step S-1 - (t mod S); bulk fills the rest in order
        tail_step = S - 1 - (np.arange(T) % S)
        bulk_step = np.repeat(np.arange(S, dtype=np.int64), room)
        yield order[np.argsort(np.concatenate([tail_step, bulk_step]), kind="stable")].reshape(S, W)


def disperse_tail(order: npt.NDArray[np.int64], S: int, W: int, cost: npt.NDArray[np.float64],
                  padded: npt.NDArray[np.float64] | None, tolerance: float) -> npt.NDArray[np.int64]:
    """Of :func:`tail_layouts` (consecutive groups are tight where batches are dense, but the
    sparse low tail, few batches spread over a wide range, makes its steps wide, and a low batch
    costs a step's max / mean little when it is alone among higher ones), the layout whose steps
    have the least total :func:`_spread` penalty (cost, and padded when given)."""
    measures = [np.asarray(cost, dtype=np.float64)] + ([] if padded is None else [np.asarray(padded, dtype=np.float64)])
    best, best_pen = order.reshape(S, W), None
    for mat in tail_layouts(order, S, W):
        pen = float(_penalty(mat, measures, tolerance).sum())
        if best_pen is None or pen < best_pen - 1e-12:
            best, best_pen = mat, pen
    return best


def goals_unmet(mat: npt.NDArray[np.int64], cost: npt.NDArray[np.float64], padded: npt.NDArray[np.float64] | None,
                tolerance: float) -> tuple[bool, bool, bool]:
    """Which of the epoch's goals the steps ``mat`` (rows of batch indices) miss: the mean
    straggler (predicted ``cost``) over :data:`GOAL_STRAGGLER` x ``tolerance``; the mean padded
    max / mean over ``1 + tolerance``; the share of steps over ``1 + 2 tolerance`` above
    :data:`GOAL_STEPS_OVER` (the last two False without ``padded``)."""
    strag = float(_spreads(np.asarray(cost, dtype=np.float64)[mat]).mean()) - 1.0 > GOAL_STRAGGLER * tolerance
    if padded is None:
        return strag, False, False
    r = _spreads(np.asarray(padded, dtype=np.float64)[mat])
    return strag, float(r.mean()) > 1.0 + tolerance, float((r > 1.0 + 2 * tolerance).mean()) > GOAL_STEPS_OVER


def _spreads(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Per step (row of ``values``: its batches' seconds), max / mean."""
    return values.max(-1) / np.maximum(values.mean(-1), 1e-12)


def _goal_scores(now: npt.NDArray[np.float64], d_st: npt.ArrayLike, d_r: npt.ArrayLike, d_over: npt.ArrayLike,
                 n: int, limits: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """(goals unmet, their summed relative excess), elementwise over candidate changes, of an
    epoch of ``n`` steps whose summed straggler, padded max / mean and steps over
    ``1 + 2 tolerance`` are ``now`` plus ``d_st``, ``d_r`` and ``d_over`` (:func:`goals_unmet`'s
    goals; ``limits``: theirs, :func:`_goal_limits`)."""
    ex = (np.maximum(0.0, (now[0] + np.asarray(d_st)) / n - limits[0]) / limits[0],
          np.maximum(0.0, (now[1] + np.asarray(d_r)) / n - 1.0 - limits[1]) / limits[1],
          np.maximum(0.0, (now[2] + np.asarray(d_over)) / n - limits[2]) / limits[2])
    unmet = (ex[0] > 1e-12).astype(np.int64) + (ex[1] > 1e-12) + (ex[2] > 1e-12)
    return unmet, ex[0] + ex[1] + ex[2]


def _goal_limits(tolerance: float) -> npt.NDArray[np.float64]:
    """The goals' limits at ``tolerance``: straggler, padded max / mean - 1, share of steps over
    ``1 + 2 tolerance`` (at least 1e-9, so an excess over a limit stays finite)."""
    return np.maximum([GOAL_STRAGGLER * tolerance, tolerance, GOAL_STEPS_OVER], 1e-9)


def _swapped_spreads(tot_a: npt.NDArray[np.float64], va: npt.NDArray[np.float64], top_a: npt.NDArray[np.float64],
                     tot_b: npt.NDArray[np.float64], vb: npt.NDArray[np.float64], top_b: npt.NDArray[np.float64],
                     W: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Max / mean of step a with its batch ``va`` given for ``vb``, and of step b with ``vb``
    given for ``va`` (``tot``: a step's sum, ``top``: its max without the batch given;
    broadcast together): one swap between two steps of ``W`` batches, for any arrays of them."""
    ra = np.maximum(top_a, vb) * W / np.maximum(tot_a - va + vb, 1e-12)
    rb = np.maximum(top_b, va) * W / np.maximum(tot_b - vb + va, 1e-12)
    return ra, rb


def _best_swap(mat: npt.NDArray[np.int64], c: npt.NDArray[np.float64], p: npt.NDArray[np.float64],
               worst: npt.NDArray[np.int64], st: npt.NDArray[np.float64], r: npt.NDArray[np.float64],
               now: npt.NDArray[np.float64], n: int, limits: npt.NDArray[np.float64], lim: float,
               score: tuple[int, float]) -> tuple[int, int, int, int] | None:
    """:func:`reach_goals`' best swap of a batch ``i`` of a step ``a`` in ``worst`` with a batch
    ``j`` of another step ``b``: ``(a, b, i, j)``, or None where none scores better than
    ``score``. A step's batches tried are its two highest and two lowest of each measure (where
    a step's max / mean moves most; every batch at ``W`` <= 8): an (len(worst), S, K, K) array
    comparison, ``K`` <= 8."""
    S, W = mat.shape
    vc, vp = c[mat], p[mat]  # (S, W)
    if W <= 8:
        cand = np.broadcast_to(np.arange(W), (S, W))
    else:
        ends = np.array([0, 1, W - 2, W - 1])
        cand = np.concatenate([np.argsort(vc, axis=1, kind="stable")[:, ends],
                               np.argsort(vp, axis=1, kind="stable")[:, ends]], axis=1)
    rows = np.arange(S)[:, None]
    after_a, after_b = [], []
    for v in (vc, vp):
        tot = v.sum(1)
        top = _max_without(v)[rows, cand]  # (S, K): a step's max without each candidate
        vk = v[rows, cand]  # (S, K)
        ra, rb = _swapped_spreads(tot[worst][:, None, None, None], vk[worst][:, None, :, None],
                                  top[worst][:, None, :, None], tot[None, :, None, None], vk[None, :, None, :],
                                  top[None, :, None, :], W)
        after_a.append(ra)
        after_b.append(rb)
    d_st = (after_a[0] - 1.0) + (after_b[0] - 1.0) - st[worst][:, None, None, None] - st[None, :, None, None]
    d_r = after_a[1] + after_b[1] - r[worst][:, None, None, None] - r[None, :, None, None]
    over = r > lim
    d_over = ((after_a[1] > lim).astype(np.int64) + (after_b[1] > lim) - over[worst][:, None, None, None]
              - over[None, :, None, None])
    unmet, total = _goal_scores(now, d_st, d_r, d_over, n, limits)
    key = np.where(worst[:, None, None, None] != np.arange(S)[None, :, None, None], unmet * 1e6 + total, np.inf)
    w, b, i, j = np.unravel_index(int(np.argmin(key)), key.shape)
    if (int(unmet[w, b, i, j]), float(total[w, b, i, j])) >= (score[0], score[1] - 1e-12):
        return None
    a = int(worst[w])
    return a, int(b), int(cand[a, i]), int(cand[b, j])


def reach_goals(mat: npt.NDArray[np.int64], cost: npt.NDArray[np.float64], padded: npt.NDArray[np.float64] | None,
                tolerance: float, *, runs: npt.NDArray[np.int64] | None = None,
                max_rounds: int = REACH_ROUNDS) -> npt.NDArray[np.int64]:
    """Swap batches between the steps ``mat`` while that meets more of the epoch's goals or
    lowers by how much they are missed (:func:`_goal_scores` over the epoch: these steps and
    the same-bucket ``runs``, which stay; not a step's own penalty, as :func:`repair_steps`
    weighs). For few-step epochs, where one step is several % of the epoch: each round weighs
    the swaps of :data:`REACH_STEPS` steps furthest from the goals (every step where none of
    theirs helps) with every other step (:func:`_best_swap`) and takes the best; at most
    ``max_rounds`` swaps. Deterministic (ties: the first in step and batch order)."""
    if padded is None:
        return mat
    mat = mat.copy()
    S, W = mat.shape
    if S < 2 or W < 2:
        return mat
    c, p = np.asarray(cost, dtype=np.float64), np.asarray(padded, dtype=np.float64)
    lim = 1.0 + 2 * tolerance
    fixed = np.zeros(3)  # the runs' summed straggler, padded max / mean and steps over lim
    n = S
    if runs is not None and runs.shape[0]:
        st_f, r_f = _spreads(c[runs]) - 1.0, _spreads(p[runs])
        fixed[:] = st_f.sum(), r_f.sum(), (r_f > lim).sum()
        n = S + runs.shape[0]
    limits = _goal_limits(tolerance)
    for _ in range(int(max_rounds)):
        st, r = _spreads(c[mat]) - 1.0, _spreads(p[mat])
        now = np.array([st.sum(), r.sum(), (r > lim).sum()]) + fixed
        unmet, total = _goal_scores(now, 0.0, 0.0, 0, n, limits)
        score = (int(unmet), float(total))
        if score[0] == 0:
            break
        # the REACH_STEPS steps furthest from the goals (a; all steps where none of those has a
        # swap that helps), each batch i of them swapped with batch j of any other step b
        bad = (r > lim) * 10.0 + st / limits[0] + (r - 1.0) / limits[1]
        order = np.argsort(-bad, kind="stable")
        swap = None
        for worst in ([order[:REACH_STEPS], order] if S > REACH_STEPS else [order]):
            swap = _best_swap(mat, c, p, worst, st, r, now, n, limits, lim, score)
            if swap is not None:
                break
        if swap is None:
            break
        a, b, i, j = swap
        mat[a, i], mat[b, j] = mat[b, j], mat[a, i]
    return mat


def repair_steps(mat: npt.NDArray[np.int64], cost: npt.NDArray[np.float64], padded: npt.NDArray[np.float64] | None,
                 tolerance: float, reach: int = 8, max_rounds: int | None = None) -> npt.NDArray[np.int64]:
    """Even out steps by swapping batches between steps of nearby level.

    ``mat``: (steps, W) batch indices, steps in ascending order of level; ``cost`` (s) and
    ``padded`` (s, or None) per batch. A step's penalty (:func:`_penalty`) is
    :data:`COST_WEIGHT` x :func:`_spread` of max / mean ``cost`` plus that of ``padded``.
    Repeatedly the worst step not known to be stuck, while its penalty is above what every
    measure at half the tolerance gives, takes the swap of one of its batches with one of a
    step at most ``reach`` places away that lowers the two steps' penalty most; a step with no
    such swap is stuck until a swap changes it. Each swap lowers the total penalty, so it ends
    (at most ``max_rounds`` swaps, default 4 x steps). Only the two highest and two lowest
    batches of each measure in the worst step are tried. Loops over swaps; each is a
    (2 reach, 8, W) array comparison.
    """
    mat = mat.copy()
    S, W = mat.shape
    if S < 2 or W < 2:
        return mat
    measures = [np.asarray(cost, dtype=np.float64)] + ([] if padded is None else [np.asarray(padded, dtype=np.float64)])

    pen = _penalty(mat, measures, tolerance)
    stuck = np.zeros(S, dtype=bool)
    small = S * W <= SMALL_EPOCH or W <= 4  # few batches: every batch of the worst step, every step
    if small:
        reach = S
    rounds = 4 * S if max_rounds is None else int(max_rounds)
    good = (COST_WEIGHT + len(measures) - 1) * tolerance / 2  # every measure within half the tolerance
    for _ in range(rounds):
        live = np.where(stuck, -np.inf, pen)
        a = int(np.argmax(live))
        if live[a] <= good:
            break
        lo, hi = max(0, a - reach), min(S, a + reach + 1)
        others = np.array([b for b in range(lo, hi) if b != a], dtype=np.int64)
        if others.shape[0] == 0:
            stuck[a] = True
            continue
        A = mat[a]  # (W,)
        Bm = mat[others]  # (k, W)
        # the batches of a worth moving: the two highest and two lowest of each measure
        cand = (np.arange(W) if small else
                np.unique(np.concatenate([np.argsort(m[A], kind="stable")[[0, 1, -2, -1]] for m in measures])))
        delta = -pen[a] - pen[others][:, None, None] + np.zeros((1, cand.shape[0], W))  # (k, cand, W_b)
        for m in measures:
            va, vb = m[A], m[Bm]  # (W,), (k, W)
            # step a with its batch i replaced by batch j of step b, and b with j replaced by i
            a_top = _max_without(va[None, :])[0][cand]  # max of a without i
            b_top = _max_without(vb)  # (k, W): max of b without j
            ra, rb = _swapped_spreads(va.sum(), va[cand][None, :, None], a_top[None, :, None],
                                      vb.sum(1)[:, None, None], vb[:, None, :], b_top[:, None, :], W)
            w, tol = (COST_WEIGHT, COST_TOL * tolerance) if m is measures[0] else (1.0, tolerance)
            delta = delta + w * _spread(ra, tol)
            delta = delta + w * _spread(rb, tol)
        k, c, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
        if delta[k, c, j] >= -1e-9:
            stuck[a] = True
            continue
        b, i = int(others[k]), int(cand[c])
        mat[a, i], mat[b, j] = mat[b, j], mat[a, i]
        pen[[a, b]] = _penalty(mat[[a, b]], measures, tolerance)
        stuck[[a, b]] = False
    return mat


def _max_without(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Per row of ``v`` (n, W), W >= 2: the max of the row without each entry."""
    top = np.argmax(v, axis=1)
    first = v[np.arange(v.shape[0]), top]
    rest = v.copy()
    rest[np.arange(v.shape[0]), top] = -np.inf
    second = rest.max(1)
    out = np.repeat(first[:, None], v.shape[1], axis=1)
    out[np.arange(v.shape[0]), top] = second
    return out


def layout(steps: BalancedSteps, world_size: int, rng_steps: np.random.Generator | None,
           rng_ranks: np.random.Generator) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Rank-major layout of balanced steps: (CSR offsets, index into the formed rows, bucket per
    batch). ``rng_steps`` shuffles the steps (None keeps ascending time); ``rng_ranks`` deals
    each step's batches to ranks."""
    order = layout_order(steps, world_size, rng_steps, rng_ranks)
    offsets, gather = gather_segments(steps.seg_offsets, order)
    return offsets, gather, steps.seg_bucket[order]


def layout_order(steps: BalancedSteps, world_size: int, rng_steps: np.random.Generator | None,
                 rng_ranks: np.random.Generator, rank: npt.NDArray[np.int64] | None = None,
                 pos: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
    """The segment of each rank-major batch of :func:`layout` (per batch only). ``rank``: each
    segment's rank, given (ranks of different speeds, :func:`bucketing.speeds.speed_rank_order`);
    ``pos``: each step's position, given (:func:`bucketing.quota.window_order`)."""
    W, S = int(world_size), steps.num_steps
    n = S * W
    if pos is None:
        pos = rng_steps.permutation(S) if rng_steps is not None else np.arange(S)  # step -> position
    if rank is None:
        within = np.lexsort((rng_ranks.random(n), steps.seg_step))  # segments grouped by step, shuffled inside
        rank = np.empty(n, dtype=np.int64)
        rank[within] = np.tile(np.arange(W, dtype=np.int64), S)
    order = np.empty(n, dtype=np.int64)
    order[rank * S + pos[steps.seg_step]] = np.arange(n, dtype=np.int64)
    return order
