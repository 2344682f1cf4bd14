"""Tail-worker simulator: how long ranks wait for the slowest rank at each step.

Under data-parallel training every step ends with an all-reduce, so a step lasts as long as
its slowest rank's batch. For a (steps x ranks) matrix of batch times (seconds, from
:class:`bucketing.costmodel.CostModel`):

    step time   = max over ranks
    epoch time  = sum of step times
    idle        = 1 - sum(all batch times) / (world_size * epoch time)

A *synchronized* plan puts batches of one bucket at each step; an *unsynchronized* one
(what samplers that pick buckets per rank do) deals the same batches to ranks in random
order, so each rank draws its own bucket. ``speedup`` is the step-time saving of
synchronization: ``1 - epoch_time(sync) / epoch_time(unsync)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class SimResult:
    world_size: int
    steps_sync: int
    steps_unsync: int
    time_sync: float  # seconds per epoch (sum of step times)
    time_unsync: float
    idle_sync: float  # fraction of rank-time spent waiting
    idle_unsync: float
    #: median batches per bucket; below ``world_size`` most synchronized steps are re-split
    #: tails, so the comparison says little about training at that scale
    batches_per_bucket: float = 0.0

    @property
    def representative(self) -> bool:
        return self.batches_per_bucket >= self.world_size

    @property
    def speedup(self) -> float:
        return 1.0 - self.time_sync / self.time_unsync if self.time_unsync else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["speedup"] = self.speedup
        out["representative"] = self.representative
        return out


def epoch_time_idle(times: npt.NDArray[np.floating]) -> tuple[float, float]:
    """(epoch seconds, idle fraction) of a (steps, ranks) matrix; NaN = rank has no batch."""
    if times.size == 0:
        return 0.0, 0.0
    step = np.nanmax(times, axis=1)
    total = float(step.sum())
    busy = float(np.nansum(times))
    return total, 1.0 - busy / (times.shape[1] * total)


def _pad_to_steps(values: npt.NDArray[np.float64], world_size: int) -> npt.NDArray[np.float64]:
    steps = -(-values.shape[0] // world_size)
    out = np.full(steps * world_size, np.nan)
    out[: values.shape[0]] = values
    return out.reshape(steps, world_size)


def synchronized_matrix(bucket: npt.NDArray[np.integer], cost: npt.NDArray[np.floating], world_size: int,
                        rng: np.random.Generator, overhead: float = 0.0) -> npt.NDArray[np.float64]:
    """Deal batches so each step holds ``world_size`` batches of one bucket (random order
    inside a bucket). A bucket's last, partial step is spread evenly over all ranks, as the
    planner re-splits tails: each rank gets ``overhead + sum(cost - overhead) / world_size``."""
    bucket = np.asarray(bucket)
    order = np.lexsort((rng.random(bucket.shape[0]), bucket))
    b = bucket[order]
    c = np.asarray(cost, dtype=np.float64)[order]
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]]) if b.size else np.empty(0, np.int64)
    ends = np.r_[starts[1:], b.size]
    blocks = []
    for s, e in zip(starts, ends):
        full = s + (e - s) // world_size * world_size
        if full > s:
            blocks.append(c[s:full].reshape(-1, world_size))
        if e > full:
            blocks.append(np.full((1, world_size), overhead + float((c[full:e] - overhead).sum()) / world_size))
    return np.concatenate(blocks) if blocks else np.empty((0, world_size))


def unsynchronized_matrix(cost: npt.NDArray[np.floating], world_size: int,
                          rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Deal the same batches in random order: each rank draws its bucket independently."""
    return _pad_to_steps(rng.permutation(np.asarray(cost, dtype=np.float64)), world_size)


def simulate(bucket: npt.NDArray[np.integer], cost: npt.NDArray[np.floating], world_size: int,
             seed: int = 0, sync_matrix: npt.NDArray[np.floating] | None = None,
             overhead: float = 0.0) -> SimResult:
    """Synchronized vs unsynchronized epoch time and idle fraction for one epoch's batches.

    ``bucket`` and ``cost`` (seconds) are per batch. ``sync_matrix`` (steps x ranks) uses a
    plan's own step layout instead of re-dealing (at the plan's world size); ``overhead``
    is the per-step part of a batch's cost (not divided when a tail is re-split).
    """
    rng = np.random.default_rng([seed, world_size])
    sync = sync_matrix if sync_matrix is not None else synchronized_matrix(bucket, cost, world_size, rng, overhead)
    unsync = unsynchronized_matrix(cost, world_size, rng)
    ts, isy = epoch_time_idle(sync)
    tu, iun = epoch_time_idle(unsync)
    per_bucket = float(np.median(np.unique(np.asarray(bucket), return_counts=True)[1])) if len(bucket) else 0.0
    return SimResult(world_size, int(sync.shape[0]), int(unsync.shape[0]), ts, tu, isy, iun, per_bucket)


# --------------------------------------------------------------------------- strategies

STRATEGIES = ("sync", "adpsgd", "hybrid")


@dataclass(frozen=True)
class StrategyResult:
    """One epoch under a training strategy (see :func:`simulate_strategy`)."""

    strategy: str
    world_size: int
    group_size: int
    time: float  # seconds until the last learner finishes
    utt_per_s: float  # utterances of the epoch / time
    idle: float  # share of rank time not spent computing a batch
    staleness: int  # largest gap in completed steps between two learners at any moment

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ring_finish(compute: npt.NDArray[np.float64], exchange: float) -> npt.NDArray[np.float64]:
    """Finish times (steps, learners) of learners on a ring: learner ``i`` ends step ``s`` after
    its own compute and one exchange with neighbour ``i + 1``, which must have ended step
    ``s - 1`` (bounded staleness 1 between neighbours). A loop over steps, vectorized over
    learners."""
    S, L = compute.shape
    done = np.empty((S, L))
    prev = np.zeros(L)
    for s in range(S):
        ready = prev + compute[s]
        done[s] = np.maximum(ready, np.roll(prev, -1)) + exchange if L > 1 else ready
        prev = done[s]
    return done


def _staleness(done: npt.NDArray[np.float64]) -> int:
    """Largest number of steps a learner is behind another when that one ends a step."""
    S, L = done.shape
    if L < 2 or S == 0:
        return 0
    first = done.min(1)  # when the first learner ends step s
    behind = 0
    for i in range(L):  # a loop over learners, each a binary search over its steps
        completed = np.searchsorted(done[:, i], first, side="right")
        behind = max(behind, int((np.arange(1, S + 1) - completed).max()))
    return behind


def simulate_strategy(times: npt.NDArray[np.floating], sizes: npt.NDArray[np.integer], strategy: str,
                      group_size: int | None = None, exchange: float = 0.005,
                      slow: dict[int, float] | None = None) -> StrategyResult:
    """Epoch time, utterances/s, idle share and staleness of a (steps, ranks) plan under
    ``strategy``: ``sync`` (every step waits for the slowest rank: :func:`epoch_time_idle`),
    ``adpsgd`` (each rank is a learner on a ring, :func:`_ring_finish`, ``exchange`` seconds per
    step) or ``hybrid`` (sync inside groups of ``group_size`` consecutive ranks, each group one
    learner on the ring). ``slow`` multiplies a rank's batch times (``{rank: factor}``).
    ``sizes``: utterances per batch, same shape."""
    t = np.array(times, dtype=np.float64)
    W = t.shape[1]
    for r, f in (slow or {}).items():
        if not 0 <= r < W:
            raise ValueError(f"slow rank {r} is not a rank of a {W}-rank plan")
        t[:, r] *= f
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (expected {', '.join(STRATEGIES)})")
    G = {"sync": W, "adpsgd": 1}.get(strategy, group_size or W)
    if G < 1 or W % G:
        raise ValueError(f"group size {G} must be >= 1 and divide the world size {W}")
    utts = float(np.asarray(sizes).sum())
    busy = float(t.sum())
    if strategy == "sync":
        total, idle = epoch_time_idle(t)
        return StrategyResult(strategy, W, W, total, utts / total if total else 0.0, idle, 0)
    compute = t.reshape(t.shape[0], W // G, G).max(2)  # a group's step lasts as long as its slowest rank
    done = _ring_finish(compute, exchange)
    total = float(done[-1].max()) if done.size else 0.0
    idle = 1.0 - busy / (W * total) if total else 0.0
    return StrategyResult(strategy, W, G, total, utts / total if total else 0.0, idle, _staleness(done))
