"""Identical-bucket steps (``balance`` 0) planned from per-batch figures, not rows.

Pure core for a planner that keeps rows on disk (:mod:`dataprep.planning.layout`): the
formed batches come as per-batch figures (:class:`FormedBatches`: bucket, size, longest,
most tokens and their sums, in draw order) and a function that reads the rows of a run of
them; :func:`bucketing.plan.place_bucket` places them exactly as :func:`bucketing.plan.plan_epoch`
does, reading rows only where a tail is pooled, carried, borrowed or dropped (at most a few
steps' worth per bucket). The result is the :class:`bucketing.plan.EpochPlan` the in-memory
planner makes, without its ``rows``: the same steps, offsets, longest, most tokens, real sums
and dropped rows (tests compare them).

Memory: the per-batch arrays and the rows read (a bucket's tail and what is carried into it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.batching import gather_segments
from bucketing.plan import EpochPlan, Interleave, Placement, containment, interleave_order, place_bucket

#: The explicit rows of :class:`SummaryPlacement`: manifest row, duration (s), tokens, the
#: row's place in the caller's layout of the formed batches (its position files; -1: none)
#: and its group (e.g. corpus code; 0 when the caller has none).
ROW_DTYPE = np.dtype([("row", np.int64), ("d", np.float64), ("t", np.int64), ("pos", np.int64), ("c", np.int32)])


@dataclass(frozen=True)
class FormedBatches:
    """Formed batches in draw order (bucket after bucket, as
    :func:`bucketing.batching.form_batches` with no world size): bucket, utterances, longest
    (s), most tokens, and the sums of durations (s, summed as ``np.add.reduceat`` sums a
    batch) and tokens."""

    bucket: npt.NDArray[np.int32]
    size: npt.NDArray[np.int64]
    max_duration: npt.NDArray[np.float64]
    max_tokens: npt.NDArray[np.int64]
    sum_duration: npt.NDArray[np.float64]
    sum_tokens: npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Run:
    """Formed batches ``lo:hi`` placed as they are (known by their figures)."""

    lo: int
    hi: int


class SummaryPlacement(Placement):
    """:class:`bucketing.plan.Placement` whose bulk pieces are runs of formed batches
    (:class:`_Run`) and whose explicit rows are :data:`ROW_DTYPE` records read by
    ``read_rows(lo, hi)`` (the rows of formed batches ``lo:hi``, in order)."""

    row_dtype = ROW_DTYPE

    def __init__(self, num_buckets: int, formed: FormedBatches,
                 read_rows: Callable[[int, int], npt.NDArray[Any]]) -> None:
        super().__init__(num_buckets)
        self.formed = formed
        self.read_rows = read_rows

    def formed_sizes(self) -> npt.NDArray[np.int64]:
        return self.formed.size

    def formed_rows(self, lo: int, hi: int) -> npt.NDArray[Any]:
        return self.read_rows(lo, hi) if hi > lo else np.empty(0, ROW_DTYPE)

    def add_formed(self, b: int, lo: int, hi: int) -> None:
        self.add(b, _Run(lo, hi), self.formed.size[lo:hi])

    def piece_rows(self, piece: Any, sizes: npt.NDArray[np.int64], lo: int, hi: int) -> npt.NDArray[Any]:
        if isinstance(piece, _Run):
            return self.formed_rows(piece.lo + lo, piece.lo + hi)
        return super().piece_rows(piece, sizes, lo, hi)

    def piece_head(self, piece: Any, sizes: npt.NDArray[np.int64], k: int) -> Any:
        return _Run(piece.lo, piece.lo + k) if isinstance(piece, _Run) else super().piece_head(piece, sizes, k)

    def sources(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[Any]]:
        """Per placed batch, bucket after bucket: the formed batch it is whole (-1: explicit
        rows), its explicit rows' count (0 for a formed one), and the explicit rows' records."""
        formed, counts, pos = [], [], []
        for pieces, sizes in zip(self.rows, self.sizes):
            for piece, size in zip(pieces, sizes):
                if isinstance(piece, _Run):
                    formed.append(np.arange(piece.lo, piece.hi, dtype=np.int64))
                    counts.append(np.zeros(piece.hi - piece.lo, dtype=np.int64))
                else:
                    formed.append(np.full(size.shape[0], -1, dtype=np.int64))
                    counts.append(np.asarray(size, dtype=np.int64))
                    pos.append(piece)
        empty = np.empty(0, np.int64)
        return (np.concatenate(formed) if formed else empty, np.concatenate(counts) if counts else empty,
                np.concatenate(pos) if pos else np.empty(0, ROW_DTYPE))

    def figures(self) -> tuple[npt.NDArray[Any], ...]:
        """Per placed batch, bucket after bucket: size, longest, most tokens, sums of
        durations and tokens (explicit rows' batches measured here)."""
        f = self.formed
        parts: list[tuple[npt.NDArray[Any], ...]] = []
        for pieces, sizes in zip(self.rows, self.sizes):
            for piece, size in zip(pieces, sizes):
                if isinstance(piece, _Run):
                    s = slice(piece.lo, piece.hi)
                    parts.append((size, f.max_duration[s], f.max_tokens[s], f.sum_duration[s], f.sum_tokens[s]))
                    continue
                starts = np.zeros(size.shape[0], dtype=np.int64)
                np.cumsum(size[:-1], out=starts[1:])
                d, t = np.ascontiguousarray(piece["d"]), np.ascontiguousarray(piece["t"])
                parts.append((size, np.maximum.reduceat(d, starts), np.maximum.reduceat(t, starts),
                              np.add.reduceat(d, starts), np.add.reduceat(t, starts)))
        empty = (np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64))
        return tuple(np.concatenate([p[i] for p in parts]) if parts else empty[i] for i in range(5))


@dataclass(frozen=True)
class BatchSources:
    """Where the rows of each batch of an identical-bucket plan are, rank-major: the whole
    formed batch ``formed[i]`` (draw order) when >= 0, else (-1) the explicit rows
    ``records[off[i]:off[i + 1]]`` (:data:`ROW_DTYPE`; a tail pooled, carried or borrowed)."""

    formed: npt.NDArray[np.int64]
    off: npt.NDArray[np.int64]
    records: npt.NDArray[Any]

    @property
    def pos(self) -> npt.NDArray[np.int64]:
        """The explicit rows' positions."""
        return np.ascontiguousarray(self.records["pos"])

    def take(self, order: npt.NDArray[np.int64]) -> BatchSources:
        """The batches in ``order`` (e.g. sync groups' step orders)."""
        off, gather = gather_segments(self.off, order)
        return BatchSources(self.formed[order], off, self.records[gather])


def plan_identical_summaries(formed: FormedBatches, batch_sizes: npt.NDArray[np.int64], world_size: int, seed: int,
                             epoch: int, read_rows: Callable[[int, int], npt.NDArray[Any]], *,
                             max_duration: npt.NDArray[np.floating] | None = None,
                             max_tokens: npt.NDArray[np.floating] | None = None,
                             interleave: Interleave = "random") -> EpochPlan:
    """:func:`bucketing.plan.plan_epoch` with ``balance`` 0 from ``formed`` (module docstring):
    its :class:`~bucketing.plan.EpochPlan` with ``rows`` empty. ``max_duration`` /
    ``max_tokens``: the buckets' bounds (:class:`bucketing.plan.PlanInputs`'s)."""
    return plan_identical_layout(formed, batch_sizes, world_size, seed, epoch, read_rows, max_duration=max_duration,
                                 max_tokens=max_tokens, interleave=interleave)[0]


def plan_identical_layout(formed: FormedBatches, batch_sizes: npt.NDArray[np.int64], world_size: int, seed: int,
                          epoch: int, read_rows: Callable[[int, int], npt.NDArray[Any]], *,
                          max_duration: npt.NDArray[np.floating] | None = None,
                          max_tokens: npt.NDArray[np.floating] | None = None,
                          interleave: Interleave = "random") -> tuple[EpochPlan, BatchSources]:
    """:func:`plan_identical_summaries` and where each batch's rows are (``read_rows`` fills
    the records' ``pos``), for a planner that writes the shards from its own layout."""
    W = int(world_size)
    bs = np.asarray(batch_sizes, dtype=np.int64)
    B = int(bs.shape[0])
    contains = containment(max_duration, max_tokens, B)
    first = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(np.bincount(formed.bucket, minlength=B), out=first[1:])
    placed = SummaryPlacement(B, formed, read_rows)
    for b in range(B):
        place_bucket(placed, b, int(first[b]), int(first[b + 1]), W, int(bs[b]), contains)
    seq, order = interleave_order(placed.steps_per_bucket(W), W, seed, epoch, interleave)
    size, mx_d, mx_t, sm_d, sm_t = (x[order] for x in placed.figures())
    offsets = np.zeros(size.shape[0] + 1, dtype=np.int64)
    np.cumsum(size, out=offsets[1:])
    dropped = np.concatenate(placed.dropped)["row"] if placed.dropped else np.empty(0, np.int64)
    ep = EpochPlan(epoch=epoch, world_size=W, step_bucket=seq.astype(np.int32), offsets=offsets,
                   rows=np.empty(0, np.int64), max_duration=mx_d, max_tokens=mx_t, dropped=np.sort(dropped),
                   fallbacks=placed.fallbacks, resplit_buckets=placed.resplit,
                   real_seconds=float(sm_d.sum()) if size.shape[0] else 0.0, real_tokens=int(sm_t.sum()))
    src_formed, counts, pos = placed.sources()
    off = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return ep, BatchSources(src_formed, off, pos).take(order)
