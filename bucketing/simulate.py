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
