"""Sync groups: ranks synchronized only within groups of ``G`` consecutive ranks.

Pure core. A plan for ``W`` ranks (equal steps, every utterance once per epoch) is turned into
one for ``W / G`` groups that each draw the steps in their own order: group ``q`` (ranks
``q G .. q G + G - 1``) takes step ``perm_q[s]`` of the plan at its step ``s``, with ``perm_q``
a permutation fixed by ``(seed, epoch, q)``. Inside a group the batches of a step are the plan's
(same bucket, or balanced with ``--balance``); across groups nothing is synchronized, which is
what ADPSGD (``G = 1``) and HYBRID (sync inside a node, ADPSGD between nodes) train on.
``G = W`` leaves the plan unchanged. Every rank keeps the same number of steps and every
utterance is still planned exactly once per epoch (a permutation of each group's steps).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from bucketing.batching import gather_segments
from bucketing.plan import EpochPlan, PlanError


def check_group_size(world_size: int, group_size: int) -> None:
    """PlanError unless ``1 <= group_size`` divides ``world_size``."""
    if group_size < 1 or world_size % group_size:
        raise PlanError(f"sync group {group_size} must be >= 1 and divide the world size {world_size}")


def group_permutations(num_groups: int, num_steps: int, seed: int, epoch: int) -> npt.NDArray[np.int64]:
    """(groups, steps): group ``q``'s step ``s`` is the plan's step ``perm[q, s]``."""
    return np.stack([np.random.default_rng([seed, epoch, 3, q]).permutation(num_steps)
                     for q in range(num_groups)]).astype(np.int64)


def group_order(world_size: int, num_steps: int, group_size: int, seed: int,
                epoch: int) -> npt.NDArray[np.int64] | None:
    """Rank-major batch of the plan at each rank-major batch of the regrouped plan (None:
    ``group_size == world_size``, nothing moves)."""
    W, S, G = int(world_size), int(num_steps), int(group_size)
    check_group_size(W, G)
    if G == W:
        return None
    perm = group_permutations(W // G, S, seed, epoch)
    rank = np.arange(W, dtype=np.int64)
    return (rank[:, None] * S + perm[rank // G]).ravel()  # rank-major: (r, s) <- (r, perm[r // G, s])


def regroup(ep: EpochPlan, group_size: int, seed: int) -> EpochPlan:
    """``ep`` with each sync group's steps in its own order (module docstring); ``ep`` itself
    when ``group_size == world_size``."""
    order = group_order(ep.world_size, ep.num_steps, group_size, seed, ep.epoch)
    if order is None:
        return ep
    W, S = ep.world_size, ep.num_steps
    if ep.rows.shape[0]:
        offsets, gather = gather_segments(ep.offsets, order)
        rows = ep.rows[gather]
    else:  # a plan of figures only (out of core): no row-sized index
        offsets = np.zeros(order.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.diff(ep.offsets)[order], out=offsets[1:])
        rows = ep.rows
    bucket = ep.bucket_of_batch()[order]
    by_step = bucket.reshape(W, S)
    step_bucket = np.where((by_step == by_step[:1]).all(0), by_step[0], -1).astype(np.int32)
    return dataclasses.replace(ep, step_bucket=step_bucket, offsets=offsets, rows=rows,
                               max_duration=ep.max_duration[order], max_tokens=ep.max_tokens[order],
                               batch_bucket=bucket)
