"""Balanced steps for ranks of different speeds (mixed GPU types): pure arrays, no I/O.

A rank's speed is relative (1.0 the fastest; 0.5 takes twice as long for the same batch).
Ranks of one speed form a class (:class:`RankSpeeds`); each step holds, per class, as many
batches as it has ranks. Batches are formed per bucket in a slot pattern that interleaves the
classes (:func:`speed_batches`): a batch's size is its bucket's rows shared in proportion to
its class's speed, never above the bucket's batch size (the memory cap), so a slow rank's
batch is smaller and costs less. Steps (:func:`speed_steps`): each class's batches ordered by
predicted time on that class (cost ÷ speed), the k-th step taking the k-th run of each class,
so the ranks of a step finish together as far as the batches allow. Invariants: every
position exactly once; each class holds exactly ``ranks × steps`` batches; no batch empty or
above its bucket's batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class RankSpeeds:
    """Per-rank speeds grouped into classes: ``rank_class`` (W,), the class of each rank;
    ``speed`` (J,), each class's speed relative to the fastest (descending, ``speed[0]`` 1);
    ``ranks`` (J,), ranks per class; ``pattern`` (W,), the class of each slot of a round of W
    batches, classes interleaved evenly (a bucket of few batches gets every class's share)."""

    rank_class: npt.NDArray[np.int64]
    speed: npt.NDArray[np.float64]
    ranks: npt.NDArray[np.int64]
    pattern: npt.NDArray[np.int64]

    @classmethod
    def of(cls, speeds: npt.ArrayLike) -> RankSpeeds | None:
        """The classes of ``speeds`` (one positive number per rank); None where all are equal
        (an ordinary plan)."""
        s = np.asarray(speeds, dtype=np.float64)
        if s.shape[0] == 0 or np.all(s == s[0]):
            return None
        f = s / s.max()
        values, rank_class = np.unique(-f, return_inverse=True)  # class 0: the fastest
        ranks = np.bincount(rank_class, minlength=values.shape[0]).astype(np.int64)
        # slot pattern: class j's k-th slot ideally at (k + 0.5) / n_j of the round
        cls_of = np.repeat(np.arange(values.shape[0], dtype=np.int64), ranks)
        k = np.arange(cls_of.shape[0]) - np.repeat(np.cumsum(ranks) - ranks, ranks)
        pattern = cls_of[np.lexsort((cls_of, (k + 0.5) / ranks[cls_of]))]
        return cls(rank_class.astype(np.int64), -values, ranks, pattern)

    @property
    def world_size(self) -> int:
        return int(self.rank_class.shape[0])

    def rank_speed(self) -> npt.NDArray[np.float64]:
        """Each rank's speed relative to the fastest."""
        return self.speed[self.rank_class]


def slot_shares(speeds: RankSpeeds, full_cost: npt.NDArray[np.float64], overhead: float) -> npt.NDArray[np.float64]:
    """(buckets, classes): the share of a full batch's rows a class's batch holds in each
    bucket so that its predicted time is its speed times the full batch's (``full_cost`` s per
    bucket, the per-step ``overhead`` s staying whole): ``(f c - o) / (c - o)``, within
    [1/64, 1] (``f`` where ``c`` is all overhead)."""
    c = np.asarray(full_cost, dtype=np.float64)[:, None]
    f = speeds.speed[None, :]
    work = c - overhead
    share = np.where(work > 1e-12, (f * c - overhead) / np.maximum(work, 1e-12), f)
    return np.clip(share, 1.0 / 64, 1.0)


def speed_batch_counts(counts: npt.NDArray[np.int64], batch_sizes: npt.NDArray[np.int64],
                       speeds: RankSpeeds, shares: npt.NDArray[np.float64] | None = None
                       ) -> npt.NDArray[np.int64] | None:
    """Batches per bucket for :func:`speed_batches`: bucket after bucket, the fewest whose
    slots (the pattern from where the previous bucket ended) hold its rows (each slot its
    class's share of the batch size); the last step's free slots then go to the last bucket
    that has the rows for them (the buckets after it laid out again). None where the rows
    cannot fill whole steps. ``shares``: :func:`slot_shares` (default: the speeds). Loops over
    buckets, each an array step over one round of W slots."""
    c = np.asarray(counts, dtype=np.int64)
    W = speeds.world_size
    extra = np.zeros(c.shape[0], dtype=np.int64)
    nb = _sequential_counts(c, np.asarray(batch_sizes, dtype=np.float64), speeds,
                            _shares(speeds, shares, c.shape[0]), extra)
    for k in np.flatnonzero(c)[::-1].tolist():  # the last bucket with the rows takes the free slots
        free = (-int(nb.sum())) % W
        if free == 0:
            return nb
        if c[k] >= nb[k] + free:
            extra[k] += free
            nb = _sequential_counts(c, np.asarray(batch_sizes, dtype=np.float64), speeds,
                                    _shares(speeds, shares, c.shape[0]), extra)
    return nb if int(nb.sum()) % W == 0 else None


def _sequential_counts(c: npt.NDArray[np.int64], bs: npt.NDArray[np.float64], speeds: RankSpeeds,
                       share: npt.NDArray[np.float64], extra: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """:func:`speed_batch_counts` before the free slots, plus ``extra`` batches per bucket."""
    W = speeds.world_size
    nb = np.zeros(c.shape[0], dtype=np.int64)
    at = 0
    for k in np.flatnonzero(c).tolist():
        g = share[k, speeds.pattern[(at + np.arange(W)) % W]]  # the slots from here on, one round
        need = c[k] / bs[k]  # rows in units of a full batch
        rounds = int(np.floor(need / g.sum() * (1 - 1e-12)))
        rem = need - rounds * g.sum()
        part = 0 if rem <= 0 else min(int((np.cumsum(g) < rem * (1 - 1e-12)).sum()) + 1, W)
        nb[k] = min(rounds * W + part, int(c[k])) + extra[k]
        at += int(nb[k])
    return nb


def _shares(speeds: RankSpeeds, shares: npt.NDArray[np.float64] | None, buckets: int) -> npt.NDArray[np.float64]:
    return np.broadcast_to(speeds.speed[None, :], (buckets, speeds.speed.shape[0])) if shares is None else shares


def speed_batches(counts: npt.NDArray[np.int64], batch_sizes: npt.NDArray[np.int64],
                  speeds: RankSpeeds, shares: npt.NDArray[np.float64] | None = None) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                               npt.NDArray[np.int64]] | None:
    """Batches cut from each bucket's ordered rows (bucket after bucket) for ranks of
    ``speeds``: (batches per bucket, size of each batch, class of each batch), cut order. The
    i-th batch of the epoch takes slot ``i mod W`` of the pattern (so each class holds exactly
    its ranks × steps batches); a bucket's rows are shared among its batches in proportion to
    their classes' ``shares`` (:func:`slot_shares`; default: their speeds; largest remainders,
    near-equal where a share would be empty). None where the rows cannot fill whole steps."""
    nb = speed_batch_counts(counts, batch_sizes, speeds, shares)
    if nb is None:
        return None
    c = np.asarray(counts, dtype=np.int64)
    N = int(nb.sum())
    bb = np.repeat(np.arange(nb.shape[0], dtype=np.int64), nb)
    klass = speeds.pattern[np.arange(N) % speeds.world_size]
    g = _shares(speeds, shares, nb.shape[0])[bb, klass]
    total = np.bincount(bb, weights=g, minlength=nb.shape[0])
    x = c[bb] * g / total[bb]
    sizes = np.floor(x).astype(np.int64)
    left = c - np.bincount(bb, weights=sizes, minlength=nb.shape[0]).astype(np.int64)
    first = np.cumsum(nb) - nb
    order = np.lexsort((np.arange(N), sizes - x, bb))  # per bucket, largest remainder first
    sizes[order[np.arange(N) - first[bb[order]] < left[bb[order]]]] += 1
    empty = np.bincount(bb, weights=sizes == 0, minlength=nb.shape[0]) > 0
    if empty.any():  # near-equal there (the batch count never needs more than the batch size)
        k = np.arange(N) - first[bb]
        q, r = np.divmod(c[bb], np.maximum(nb[bb], 1))
        sizes = np.where(empty[bb], q + (k < r), sizes)
    return nb, sizes, klass


def speed_steps(klass: npt.NDArray[np.int64], cost: npt.NDArray[np.float64],
                speeds: RankSpeeds) -> tuple[npt.NDArray[np.int64], int]:
    """Each batch's step (0 .. S-1, ascending level) and S: class ``j``'s batches ordered by
    predicted time on its ranks (``cost`` s ÷ speed; ties by index), its k-th run of
    ``ranks[j]`` batches in step k."""
    k = np.asarray(klass, dtype=np.int64)
    N = int(k.shape[0])
    n_class = np.bincount(k, minlength=speeds.ranks.shape[0])
    S = N // speeds.world_size
    if (n_class != speeds.ranks * S).any():
        raise ValueError("each class must hold its ranks x steps batches")
    order = np.lexsort((np.arange(N), cost / speeds.speed[k], k))
    first = np.cumsum(n_class) - n_class
    pos = np.arange(N) - first[k[order]]
    step = np.empty(N, dtype=np.int64)
    step[order] = pos // speeds.ranks[k[order]]
    return step, S


def speed_rank_order(seg_step: npt.NDArray[np.int64], seg_class: npt.NDArray[np.int64], speeds: RankSpeeds,
                     num_steps: int, rng_ranks: np.random.Generator) -> npt.NDArray[np.int64]:
    """Each segment's rank: inside a step, class ``j``'s segments dealt at random to class
    ``j``'s ranks."""
    n = int(seg_step.shape[0])
    within = np.lexsort((rng_ranks.random(n), seg_class, seg_step))  # by step, then class
    ranks_by_class = np.argsort(speeds.rank_class, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[within] = np.tile(ranks_by_class, num_steps)
    return rank
